"""A model with no stream_fn: it cannot stream both ways."""


def model_fn(model_dir):
    return None


def predict_fn(data, model):
    return data
