"""Ready handlers for common models, chosen with ``SHIPYARD_TASK`` in a model's
Environment, so that a model folder as ``save_pretrained`` writes it is all a user
deploys (loaded offline, needing only ``torch`` and ``transformers``):

- ``text-generation`` (:mod:`.generation`): a ``transformers`` causal LM answering
  OpenAI's chat and completions schema, streamed token by token, concurrent requests
  decoded together;
- ``embeddings`` (:mod:`.embeddings`): a sentence-transformers folder answering OpenAI's
  embeddings schema, concurrent requests batched by the runtime's batcher.

Both need ``torch`` and ``transformers`` (the ``llm`` extra), imported only when a task
is loaded, so the runtime itself never does.
"""

from __future__ import annotations

from pathlib import Path

from shipyard.runtime.handlers import Handlers

TEXT_GENERATION = "text-generation"
EMBEDDINGS = "embeddings"
TASKS = (TEXT_GENERATION, EMBEDDINGS)


def check(task: str) -> str:
    """``task`` if it names a task; ValueError naming the ones there are otherwise."""
    if task not in TASKS:
        raise ValueError(f"SHIPYARD_TASK must be one of {', '.join(TASKS)}; got {task!r}.")
    return task


def load(task: str, model_dir: Path, *, max_batch_size: int, max_delay_s: float) -> Handlers:
    """The handlers of ``task`` bound to the model in ``model_dir``.

    ``max_batch_size`` is how many sequences one text generation step decodes together
    (``SHIPYARD_MAX_BATCH_SIZE``; the embeddings task is batched by the runtime's own
    batcher instead) and ``max_delay_s`` how long the first waits for others.
    """
    if check(task) == TEXT_GENERATION:
        from shipyard.runtime.tasks import generation

        engine = generation.load(model_dir, max_batch_size=max_batch_size, max_delay_s=max_delay_s)
        return Handlers(model=engine, module=generation)
    from shipyard.runtime.tasks import embeddings

    return Handlers(model=embeddings.load(model_dir), module=embeddings)
