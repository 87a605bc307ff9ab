"""``SHIPYARD_TASK=text-generation``: a ``transformers`` causal LM in OpenAI's chat and
completions schema (the request shape of SageMaker's LMI containers).

The model folder is what ``save_pretrained`` writes (config, weights, tokenizer, its
chat template), loaded offline with ``AutoModelForCausalLM`` and ``AutoTokenizer``.
A body with ``messages`` is a chat completion (the chat template makes the prompt), one
with ``prompt`` a text completion. Supported: ``n``, ``max_tokens`` /
``max_completion_tokens``, ``stop``, ``temperature`` (0: greedy), ``top_p``, ``seed``,
``presence_penalty``, ``frequency_penalty``, ``logit_bias``, ``logprobs`` (chat:
``logprobs`` and ``top_logprobs``; completions: ``logprobs``), ``echo``, ``stream`` with
``stream_options.include_usage``. Tools, function calling and content other than text
are refused with 400.

How requests are decoded: one :class:`Engine` thread owns the model. Handler threads
(one per request the instance takes at once: ``SHIPYARD_MAX_BATCH_SIZE``) parse a
request, hand its sequences (``n`` of them per prompt) to the engine and wait on their
own queue of tokens. The engine takes what waits (up to the batch size, after a short
delay for the rest of a burst), left-pads the prompts, runs the prefill as one batch
and then one decoding step for all of them at a time, each sequence with its own
sampling. Between two steps a finished sequence leaves the batch (its rows dropped from
the KV cache) and sequences that arrived meanwhile join it (prefilled on their own,
their cache left-padded to the batch's length and stacked onto it), so a request never
waits for another to finish while there is room (continuous batching). Written here
rather than taken from a serving library (vLLM, TGI): those bring their own server and
CUDA kernels, and this is the small loop that turns ``transformers``' forward pass into
per-token streams for our handler threads.

A streamed answer is JSON Lines of ``chat.completion.chunk`` (or ``text_completion``)
objects, one per token; a client that goes away closes the generator, which cancels its
sequences at the engine's next step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shipyard.runtime.tasks import schema
from shipyard.runtime.tasks.schema import InvalidRequest

log = logging.getLogger(__name__)

JSON_LINES = "application/jsonlines"
_END: Any = object()
_MAX_N = 16
_MAX_STOP_CHARS = 256
_GREEDY_BELOW = 1e-5
"""A temperature below this decodes greedily (dividing by it would overflow)."""
_MAX_STOP = 4
_MAX_TOP_LOGPROBS = 20


class Engine:
    """The model, its tokenizer and the thread that decodes for every request."""

    def __init__(self, model: Any, tokenizer: Any, *, max_batch_size: int, max_delay_s: float):
        import torch

        self.torch = torch
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max(max_batch_size, 1)
        self.max_delay_s = max_delay_s
        config = model.config
        self.context = int(
            getattr(config, "max_position_embeddings", 0) or tokenizer.model_max_length or 2048
        )
        eos = getattr(model.generation_config, "eos_token_id", None) or config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        pad = tokenizer.pad_token_id
        self.pad = pad if pad is not None else next(iter(self.eos), 0)
        embeddings = model.get_input_embeddings()
        size = getattr(embeddings, "num_embeddings", None) or config.vocab_size
        self.vocab = min(len(tokenizer), int(size))
        """Token ids a prompt or a logit bias may name: the tokenizer's that the model has."""
        self.waves: deque[int] = deque(maxlen=256)
        """How many sequences the latest waves decoded together (for tests and benches)."""
        self.joined = 0
        """Sequences that joined a batch already decoding (for tests and benches)."""
        self._waiting: deque[Sequence] = deque()
        self._arriving = 0
        self._current: list[Sequence] = []
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="generation", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"Engine({type(self.model).__name__}, max_batch_size={self.max_batch_size})"

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """A request being read on a handler thread: the next wave waits for it (up to
        the delay), as it is about to be submitted or refused."""
        with self._ready:
            self._arriving += 1
        try:
            yield
        finally:
            with self._ready:
                self._arriving -= 1
                self._ready.notify()

    def submit(self, sequences: list[Sequence]) -> None:
        with self._ready:
            self._waiting.extend(sequences)
            self._ready.notify()

    # -- the engine thread ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            wave = self._gather()
            self._current = list(wave)
            try:
                self._decode(wave)
            except Exception as exc:  # the model failed: every sequence it held fails
                log.exception("generation failed for %d sequences", len(self._current))
                for sequence in self._current:
                    sequence.fail(exc)

    def _gather(self) -> list[Sequence]:
        """The next wave: what waits, up to the batch size, once the oldest has waited
        ``max_delay_s`` for the rest of its burst, or at once when as many wait as the
        last wave held (the same clients coming back: a lone client never waits) and no
        handler thread is still reading a request."""
        with self._ready:
            while not self._waiting:
                self._ready.wait()
            due = time.monotonic() + self.max_delay_s
            expected = min(self.max_batch_size, self.waves[-1] if self.waves else 1)
            while len(self._waiting) < expected or (
                self._arriving and len(self._waiting) < self.max_batch_size
            ):
                left = due - time.monotonic()
                if left <= 0:
                    break
                self._ready.wait(left)
            return self._take(self.max_batch_size)

    def _take(self, room: int) -> list[Sequence]:
        """Up to ``room`` waiting sequences (more when a request's ``n`` choices would be
        split: they stay together); the caller holds the lock."""
        taken: list[Sequence] = []
        while self._waiting and len(taken) < room:
            taken.append(self._waiting.popleft())
        while taken and self._waiting and self._waiting[0].request is taken[-1].request:
            taken.append(self._waiting.popleft())
        return [s for s in taken if not s.request.cancelled]

    def _joining(self, active: int) -> list[Sequence]:
        """Sequences that arrived while a batch runs, to join it at this step."""
        if not self._waiting or active >= self.max_batch_size:
            return []
        with self._ready:
            return self._take(self.max_batch_size - active)

    def _decode(self, wave: list[Sequence]) -> None:
        """Decode ``wave``, and what joins it on the way, until every sequence is done."""
        if not wave:
            return
        self.waves.append(len(wave))
        with self.torch.inference_mode():
            batch = _Batch.prefill(self, wave)
            while True:
                joining = self._joining(len(batch.active)) if batch.joinable else []
                if joining:
                    self._current += joining
                    self.joined += len(joining)
                    batch.merge(_Batch.prefill(self, joining))
                tokens = [
                    s.step_safely(batch.logits[row], self) for row, s in enumerate(batch.active)
                ]
                keep = [row for row, s in enumerate(batch.active) if not s.done]
                if not keep:
                    return
                if len(keep) < len(batch.active):
                    batch.select(keep)
                    tokens = [tokens[row] for row in keep]
                batch.step(self, tokens)


class _Batch:
    """The sequences decoded together and the model's state for them: the KV cache,
    the attention mask (left padding masked out), each row's last position and logits.

    Rows join (``merge``: both caches left-padded to one length, then stacked) and leave
    (``select``) between steps. Joining needs the plain ``DynamicCache`` of full
    attention; a model with another cache (sliding windows, recurrent state) decodes in
    waves only."""

    def __init__(self, active: list[Sequence], cache: Any, attention: Any, last: Any, logits: Any):
        self.active = active
        self.cache = cache
        self.attention = attention
        self.last = last
        self.logits = logits
        layers = getattr(cache, "layers", None)
        self.joinable = type(cache).__name__ == "DynamicCache" and all(
            type(layer).__name__ == "DynamicLayer" for layer in layers or ()
        )

    @classmethod
    def prefill(cls, engine: Engine, sequences: list[Sequence]) -> _Batch:
        torch = engine.torch
        width = max(len(s.prompt) for s in sequences)
        ids = [[engine.pad] * (width - len(s.prompt)) + s.prompt for s in sequences]
        mask = [[0] * (width - len(s.prompt)) + [1] * len(s.prompt) for s in sequences]
        attention = torch.tensor(mask, dtype=torch.long)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        out = engine.model(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1, :].float()
        return cls(list(sequences), out.cache, attention, positions[:, -1], logits)

    def merge(self, other: _Batch) -> None:
        import torch
        from torch.nn.functional import pad

        width = max(self.attention.shape[1], other.attention.shape[1])

        def widen(tensor: Any, dim_from_end: int) -> Any:
            missing = width - tensor.shape[-dim_from_end]
            return pad(tensor, (0, 0) * (dim_from_end - 1) + (missing, 0)) if missing else tensor

        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([widen(mine.keys, 2), widen(theirs.keys, 2)])
            mine.values = torch.cat([widen(mine.values, 2), widen(theirs.values, 2)])
        self.attention = torch.cat([widen(self.attention, 1), widen(other.attention, 1)])
        self.last = torch.cat([self.last, other.last])
        self.logits = torch.cat([self.logits, other.logits])
        self.active += other.active

    def select(self, keep: list[int]) -> None:
        """Only the rows ``keep``: finished sequences leave the batch."""
        import torch

        index = torch.tensor(keep, dtype=torch.long)
        self.cache.batch_select_indices(index)
        self.attention = self.attention[index]
        self.last = self.last[index]
        self.active = [self.active[row] for row in keep]
        if self.joinable:  # padding only the rows that left needed goes with them
            used = (self.attention.sum(0) > 0).nonzero()
            first = int(used[0]) if len(used) else 0
            if first:
                self.attention = self.attention[:, first:]
                for layer in self.cache.layers:
                    layer.keys = layer.keys[:, :, first:, :]
                    layer.values = layer.values[:, :, first:, :]

    def step(self, engine: Engine, tokens: list[int]) -> None:
        """One decoding step: each row's token in, the next logits out."""
        torch = engine.torch
        self.attention = torch.cat(
            [self.attention, self.attention.new_ones((self.attention.shape[0], 1))], dim=-1
        )
        self.last = self.last + 1
        out = engine.model(
            input_ids=torch.tensor(tokens, dtype=torch.long)[:, None],
            attention_mask=self.attention,
            position_ids=self.last[:, None],
            cache=self.cache,
            use_cache=True,
        )
        self.cache = out.cache
        self.logits = out.logits[:, -1, :].float()


class Request:
    """One request's sequences and the queue its handler thread reads them from."""

    __slots__ = ("events", "cancelled")

    def __init__(self) -> None:
        self.events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.cancelled = False


class Sampling:
    """How one request picks its tokens (its parameters, checked)."""

    __slots__ = (
        "temperature",
        "top_p",
        "seed",
        "max_tokens",
        "stop",
        "top_logprobs",
        "presence",
        "frequency",
        "bias",
    )

    def __init__(self, request: dict[str, Any], *, chat: bool, vocab: int) -> None:
        self.temperature = schema.number(request, "temperature", 1.0, low=0, high=2)
        self.top_p = schema.number(request, "top_p", 1.0, low=0, high=1)
        if self.top_p == 0:
            raise InvalidRequest("top_p: must be above 0.")
        self.seed = schema.integer(request, "seed", None, low=-(2**63), high=2**64 - 1)
        self.presence = schema.number(request, "presence_penalty", 0.0, low=-2, high=2)
        self.frequency = schema.number(request, "frequency_penalty", 0.0, low=-2, high=2)
        newer = request.get("max_completion_tokens") is not None
        limit = "max_completion_tokens" if newer else "max_tokens"
        self.max_tokens = schema.integer(
            request, limit, None if chat else 16, low=1, high=2**31 - 1
        )
        self.stop = _stop(request.get("stop"))
        self.top_logprobs = _logprobs(request, chat=chat)
        self.bias = _bias(request.get("logit_bias"), vocab)


class Sequence:
    """One choice being generated: its prompt, its tokens so far, what has been sent."""

    __slots__ = (
        "request",
        "index",
        "prompt",
        "sampling",
        "tokens",
        "text",
        "sent",
        "done",
        "counts",
        "generator",
        "prefix",
        "read",
    )

    def __init__(self, request: Request, index: int, prompt: list[int], sampling: Sampling):
        self.request = request
        self.index = index
        self.prompt = prompt
        self.sampling = sampling
        self.tokens: list[int] = []
        self.text = ""
        self.sent = 0
        """How much of ``text`` has gone to the client (the rest may begin a stop)."""
        self.done = False
        self.counts: dict[int, int] = {}
        self.generator: Any = None
        self.prefix = 0
        """Where the tokens decoded again for context begin (``_decode_new``)."""
        self.read = 0
        """How many tokens ``text`` holds."""

    def fail(self, exc: Exception) -> None:
        """The request fails with ``exc``: this sequence and its siblings stop."""
        if not self.done:
            self.done = True
            self.request.cancelled = True
            self.request.events.put(exc)

    def step_safely(self, logits: Any, engine: Engine) -> int:
        """``step``; a failure of this sequence's own (its parameters, its tokens) fails
        its request alone, never the batch it decodes in."""
        try:
            return self.step(logits, engine)
        except Exception as exc:
            log.exception("a sequence failed; its request fails, the batch goes on")
            self.fail(exc)
            return engine.pad

    def step(self, logits: Any, engine: Engine) -> int:
        """Pick the next token from ``logits``, tell the handler, and say whether done."""
        if self.request.cancelled:
            self.done = True
            return engine.pad
        torch = engine.torch
        sampling = self.sampling
        scores = logits
        if sampling.bias or self.counts:
            scores = scores.clone()
            for token, value in sampling.bias.items():
                scores[token] += value
            for token, count in self.counts.items():
                scores[token] -= sampling.frequency * count + sampling.presence
        logprobs = None
        if sampling.top_logprobs is not None:
            logprobs = torch.log_softmax(scores, dim=-1)
        if sampling.temperature < _GREEDY_BELOW:  # below it, sampling is argmax anyway
            token = int(torch.argmax(scores))
        else:
            token = self._sample(scores / sampling.temperature, engine)
        self.tokens.append(token)
        self.counts[token] = self.counts.get(token, 0) + 1
        self._advance(token, logprobs, engine)
        return token

    def _decode_new(self, tokenizer: Any) -> None:
        """Add the new token's text to ``text``: the last few tokens decoded with and
        without it, so that each step costs the same however long the answer grows, and
        spacing that depends on the token before comes out as a whole decode gives it.
        Half a character waits for the token that completes it."""
        window = tokenizer.decode(self.tokens[self.prefix :], skip_special_tokens=True)
        known = tokenizer.decode(self.tokens[self.prefix : self.read], skip_special_tokens=True)
        if len(window) > len(known) and not window.endswith("\ufffd"):
            self.text += window[len(known) :]
            self.prefix, self.read = self.read, len(self.tokens)

    def _sample(self, scores: Any, engine: Engine) -> int:
        torch = engine.torch
        probs = torch.softmax(scores, dim=-1)
        top_p = self.sampling.top_p
        if top_p < 1:
            ordered, order = torch.sort(probs, descending=True)
            cut = torch.cumsum(ordered, dim=-1) - ordered > top_p
            ordered[cut] = 0
            probs = torch.zeros_like(probs).scatter_(0, order, ordered)
        if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
            return int(torch.argmax(scores))  # overflowed: the most likely token
        if self.generator is None and self.sampling.seed is not None:
            self.generator = torch.Generator().manual_seed(
                (self.sampling.seed + self.index) % 2**63
            )
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def _advance(self, token: int, logprobs: Any, engine: Engine) -> None:
        sampling = self.sampling
        finish: str | None = None
        stop_at: int | None = None
        if token in engine.eos:
            self.tokens.pop()
            finish = "stop"
        else:
            self._decode_new(engine.tokenizer)
            stop_at = _find_stop(self.text, sampling.stop, self.sent)
            if stop_at is not None:
                finish = "stop"
            elif sampling.max_tokens is not None and len(self.tokens) >= sampling.max_tokens:
                finish = "length"
            elif len(self.prompt) + len(self.tokens) >= engine.context:
                finish = "length"
        if finish is None:
            end = len(self.text) - _held(self.text, sampling.stop)
        else:
            end = stop_at if stop_at is not None else len(self.text)
        delta = self.text[self.sent : max(end, self.sent)]
        self.sent = max(end, self.sent)
        entry = None
        if logprobs is not None and token not in engine.eos:
            entry = _logprob_entry(token, logprobs, sampling.top_logprobs or 0, engine)
        if finish is not None:
            self.done = True
        self.request.events.put((self.index, delta, entry, finish, len(self.tokens)))


def load(model_dir: Path, *, max_batch_size: int, max_delay_s: float) -> Engine:
    """The model folder's causal LM and tokenizer, loaded offline, on its decoding thread."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    model.eval()
    return Engine(model, tokenizer, max_batch_size=max_batch_size, max_delay_s=max_delay_s)


# -- the handler: one request, on its handler thread ---------------------------------------


def transform_fn(engine: Engine, data: bytes, content_type: str, accept: str) -> Any:
    with engine.arriving():
        answer = _read(engine, data)
        engine.submit(answer.sequences)
    if answer.request.get("stream") is True:
        return answer.chunks(), JSON_LINES
    # The whole answer, still as an iterator: the runtime pulls it a token at a time, so
    # that a client who leaves before it is done closes it, as it closes a stream.
    return answer.whole(), "application/json"


def _read(engine: Engine, data: bytes) -> Answer:
    """The request in ``data``, checked and tokenized, as the answer its sequences make."""
    request = schema.body(data)
    chat = "messages" in request
    if not chat and "prompt" not in request:
        raise InvalidRequest(
            'Send a chat completion ({"messages": [...]}) or a text completion ({"prompt": ...}).'
        )
    schema.unsupported(request, "tools", "tool_choice", "functions", "function_call")
    _check_format(request.get("response_format"))
    n = schema.integer(request, "n", 1, low=1, high=_MAX_N) or 1
    best_of = request.get("best_of")
    if best_of is not None and best_of != n:
        raise InvalidRequest("best_of: only equal to n (or unset) is supported.")
    if request.get("suffix"):
        raise InvalidRequest("suffix: not supported by shipyard's text generation handler.")
    sampling = Sampling(request, chat=chat, vocab=engine.vocab)
    prompts = [_chat_prompt(engine, request)] if chat else _prompts(engine, request)
    most = max(_MAX_N, engine.max_batch_size)
    if len(prompts) * n > most:
        raise InvalidRequest(
            f"{len(prompts)} prompts with n={n} are {len(prompts) * n} sequences; this model "
            f"decodes at most {most} for one request."
        )
    for prompt in prompts:
        if len(prompt) >= engine.context:
            raise InvalidRequest(
                f"The prompt is {len(prompt)} tokens; this model's context holds {engine.context}."
            )
    job = Request()
    sequences = [
        Sequence(job, p * n + c, prompt, sampling)
        for p, prompt in enumerate(prompts)
        for c in range(n)
    ]
    return Answer(request, engine, sequences, chat=chat, prompts=prompts)


class Answer:
    """One request's answer, built from its sequences' events: whole or as chunks."""

    def __init__(
        self,
        request: dict[str, Any],
        engine: Engine,
        sequences: list[Sequence],
        *,
        chat: bool,
        prompts: list[list[int]],
    ) -> None:
        self.request = request
        self.engine = engine
        self.sequences = sequences
        self.job = sequences[0].request
        self.chat = chat
        self.prompts = prompts
        self.id = schema.identifier("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        self.model = request.get("model") if isinstance(request.get("model"), str) else ""
        self.object = "chat.completion" if chat else "text_completion"
        self.echo = not chat and request.get("echo") is True
        self.prompt_tokens = sum(len(p) for p in prompts)
        self.wants_logprobs = sequences[0].sampling.top_logprobs is not None
        self.prompt_text = (
            [engine.tokenizer.decode(p, skip_special_tokens=True) for p in prompts]
            if self.echo
            else []
        )

    def events(self) -> Iterator[tuple[int, str, Any, str | None, int]]:
        """Every sequence's events, as they come, until all are done."""
        left = len(self.sequences)
        while left:
            event = self.job.events.get()
            if isinstance(event, Exception):
                raise event
            if event[3] is not None:
                left -= 1
            yield event

    def whole(self) -> Iterator[bytes]:
        """The answer in one piece, after an empty one per token; closing it early (the
        client left) cancels the request's sequences."""
        texts = [""] * len(self.sequences)
        finishes: list[str | None] = [None] * len(self.sequences)
        entries: list[list[Any]] = [[] for _ in self.sequences]
        completion = 0
        try:
            for index, delta, entry, finish, count in self.events():
                texts[index] += delta
                if entry is not None:
                    entries[index].append(entry)
                if finish is not None:
                    finishes[index] = finish
                    completion += count
                yield b""
        finally:
            self.job.cancelled = True  # a no-op once every sequence is done
        yield json.dumps(self._completion(texts, entries, finishes, completion)).encode()

    def _completion(
        self,
        texts: list[str],
        entries: list[list[Any]],
        finishes: list[str | None],
        completion: int,
    ) -> dict[str, Any]:
        choices = []
        n = len(self.sequences) // len(self.prompts)
        for index, text in enumerate(texts):
            if self.echo:
                text = self.prompt_text[index // n] + text
            choices.append(self._choice(index, text, entries[index], finishes[index]))
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self._usage(completion),
            "system_fingerprint": None,
        }

    def _choice(
        self, index: int, text: str, entries: list[Any], finish: str | None
    ) -> dict[str, Any]:
        logprobs = self._logprobs(entries) if self.wants_logprobs else None
        if self.chat:
            message = {"role": "assistant", "content": text, "refusal": None}
            return {
                "index": index,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": finish,
            }
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def _logprobs(self, entries: list[Any]) -> dict[str, Any]:
        if self.chat:
            return {"content": [e.chat() for e in entries], "refusal": None}
        offsets, at = [], 0
        for entry in entries:
            offsets.append(at)
            at += len(entry.token)
        return {
            "tokens": [e.token for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t: lp for t, lp, _ in e.top} for e in entries],
            "text_offset": offsets,
        }

    def _usage(self, completion: int) -> dict[str, int]:
        prompt = self.prompt_tokens
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def chunks(self) -> Iterator[bytes]:
        """The streamed answer: one chunk object per token, JSON Lines. Closing it (the
        client left) cancels the request's sequences."""
        include_usage = (
            isinstance(self.request.get("stream_options"), dict)
            and self.request["stream_options"].get("include_usage") is True
        )
        usage_field = {"usage": None} if include_usage else {}
        completion = 0
        try:
            if self.chat:
                for index in range(len(self.sequences)):
                    role = {"role": "assistant", "content": ""}
                    yield self._chunk(index, role, None, None, usage_field)
            elif self.echo:
                n = len(self.sequences) // len(self.prompts)
                for index in range(len(self.sequences)):
                    text = self.prompt_text[index // n]
                    yield self._chunk(index, text, None, None, usage_field)
            for index, text, entry, finish, count in self.events():
                if finish is not None:
                    completion += count
                if not text and finish is None and entry is None:
                    continue  # held back (a stop may begin here): nothing to send yet
                delta: Any = {"content": text} if self.chat else text
                if self.chat and finish is not None and not text:
                    delta = {}
                logprobs = self._logprobs([entry]) if entry is not None else None
                yield self._chunk(index, delta, logprobs, finish, usage_field)
            if include_usage:
                chunk = self._base()
                chunk["choices"] = []
                chunk["usage"] = self._usage(completion)
                yield _line(chunk)
        finally:
            self.job.cancelled = True  # a no-op once every sequence is done

    def _base(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
        }

    def _chunk(
        self,
        index: int,
        delta: Any,
        logprobs: Any,
        finish: str | None,
        usage_field: dict[str, Any],
    ) -> bytes:
        chunk = self._base()
        key = "delta" if self.chat else "text"
        choice = {"index": index, key: delta, "logprobs": logprobs, "finish_reason": finish}
        chunk["choices"] = [choice]
        chunk.update(usage_field)
        return _line(chunk)


class _Entry:
    """One token's log probability and its most likely alternatives."""

    __slots__ = ("token", "logprob", "top")

    def __init__(self, token: str, logprob: float, top: list[tuple[str, float, list[int]]]):
        self.token = token
        self.logprob = logprob
        self.top = top

    def chat(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "logprob": self.logprob,
            "bytes": list(self.token.encode()),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": raw} for t, lp, raw in self.top],
        }


def _logprob_entry(token: int, logprobs: Any, top: int, engine: Engine) -> _Entry:
    decode = engine.tokenizer.decode
    best: list[tuple[str, float, list[int]]] = []
    if top:
        values, ids = engine.torch.topk(logprobs, top)
        for value, other in zip(values.tolist(), ids.tolist(), strict=True):
            text = decode([other])
            best.append((text, value, list(text.encode())))
    return _Entry(decode([token]), float(logprobs[token]), best)


def _line(chunk: dict[str, Any]) -> bytes:
    return json.dumps(chunk).encode() + b"\n"


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise InvalidRequest("stop: expected a string or a list of non-empty strings.")
    if len(stops) > _MAX_STOP:
        raise InvalidRequest(f"stop: at most {_MAX_STOP} sequences.")
    if any(len(stop) > _MAX_STOP_CHARS for stop in stops):
        raise InvalidRequest(f"stop: a stop sequence holds at most {_MAX_STOP_CHARS} characters.")
    return tuple(stops)


def _find_stop(text: str, stops: tuple[str, ...], sent: int) -> int | None:
    """Where the first stop sequence begins in ``text`` (searching from what may still
    hold one), or None."""
    found = None
    for stop in stops:
        at = text.find(stop, max(sent - len(stop), 0))
        if at != -1 and (found is None or at < found):
            found = at
    return found


def _held(text: str, stops: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` could begin a stop sequence."""
    held = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:size]):
                held = size
                break
    return held


def _logprobs(request: dict[str, Any], *, chat: bool) -> int | None:
    """How many alternatives each token's log probability comes with; None: no
    log probabilities at all."""
    if chat:
        wanted = request.get("logprobs")
        if wanted is not None and not isinstance(wanted, bool):
            raise InvalidRequest("logprobs: expected true or false.")
        top = schema.integer(request, "top_logprobs", None, low=0, high=_MAX_TOP_LOGPROBS)
        if top is not None and not wanted:
            raise InvalidRequest("top_logprobs: requires logprobs to be true.")
        return (top or 0) if wanted else None
    return schema.integer(request, "logprobs", None, low=0, high=5)


def _bias(value: Any, vocab: int) -> dict[int, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest("logit_bias: expected an object of token ids to numbers.")
    bias: dict[int, float] = {}
    for key, amount in value.items():
        try:
            token = int(key)
        except ValueError:
            raise InvalidRequest(f"logit_bias: {key!r} is not a token id.") from None
        if not 0 <= token < vocab:
            raise InvalidRequest(f"logit_bias: token {token} is not in the vocabulary.")
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            raise InvalidRequest(f"logit_bias: the bias of {key} is not a number.")
        if not -100 <= amount <= 100:
            raise InvalidRequest(f"logit_bias: {amount} is not between -100 and 100.")
        bias[token] = float(amount)
    return bias


def _check_format(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or value.get("type") != "text":
        raise InvalidRequest(
            'response_format: only {"type": "text"} is supported by shipyard\'s text '
            "generation handler."
        )


def _chat_prompt(engine: Engine, request: dict[str, Any]) -> list[int]:
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: expected a non-empty list of messages.")
    conversation = []
    for n, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{n}]: expected an object with role and content.")
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant"):
            raise InvalidRequest(
                f"messages[{n}].role: {json.dumps(role)[:40]} is not supported (system, "
                "developer, user, assistant; no tool messages)."
            )
        if message.get("tool_calls") or message.get("function_call"):
            raise InvalidRequest(f"messages[{n}]: tool calls are not supported.")
        conversation.append(
            {"role": "system" if role == "developer" else role, "content": _text(message, n)}
        )
    tokenizer = engine.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequest(
            "This model's tokenizer has no chat template: send a text completion "
            '(/v1/completions, {"prompt": ...}) instead.'
        )
    text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _text(message: dict[str, Any], n: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if content is None and message.get("role") == "assistant":
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise InvalidRequest(
                    f"messages[{n}].content: parts of type {json.dumps(kind)[:40]} are not "
                    "supported; only text."
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequest(f"messages[{n}].content: a text part's text must be a string.")
            parts.append(text)
        return "".join(parts)
    raise InvalidRequest(f"messages[{n}].content: expected a string or a list of text parts.")


def _prompts(engine: Engine, request: dict[str, Any]) -> list[list[int]]:
    prompt = request.get("prompt")
    tokenizer = engine.tokenizer
    vocab = engine.vocab

    def ids(tokens: list[Any]) -> list[int]:
        if not tokens or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens
        ):
            raise InvalidRequest("prompt: token lists must hold token ids of this model.")
        return list(tokens)

    def text(value: str) -> list[int]:
        found = list(tokenizer(value)["input_ids"])
        if not found:
            raise InvalidRequest("prompt: an empty prompt; send some text.")
        return found

    if isinstance(prompt, str):
        return [text(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [text(p) for p in prompt]
        if all(isinstance(p, int) for p in prompt):
            return [ids(prompt)]
        if all(isinstance(p, list) for p in prompt):
            return [ids(p) for p in prompt]
    raise InvalidRequest(
        "prompt: expected a string, a list of strings, a list of token ids or a list of such lists."
    )
