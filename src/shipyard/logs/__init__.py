"""The CloudWatch Logs subset: instance and job logs as log groups and streams."""
