"""A model whose weights cannot be found: the instance must exit and say why."""


def model_fn(model_dir: str) -> object:
    raise RuntimeError("weights missing")
