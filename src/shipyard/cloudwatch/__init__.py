"""CloudWatch on the gateway: metrics under SageMaker's names, kept in the store, and
alarms that act on them.

- recorder.py: what the data path counts, written as datapoints every tick
- service.py: PutMetricData, the reads (GetMetricData, GetMetricStatistics, ListMetrics)
  and the alarms' definitions
- expressions.py: metric math
- alarms.py: evaluation, state changes and actions (topics, step scaling policies)
"""
