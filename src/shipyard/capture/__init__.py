"""Data capture: a sampled share of invocations written as SageMaker's JSON
Lines records, off the request's path.

- config.py: an endpoint config's DataCaptureConfig, in plain words;
- jsonl.py: one captured invocation as SageMaker's record, and where its file goes;
- writer.py: the per-variant sampler the data path calls, and the one writer per
  gateway that buffers what it hands over and flushes it in files.
"""
