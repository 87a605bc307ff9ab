"""Application Auto Scaling for endpoint variants: the API's service (scaling.py) and the
loop that applies its policies to the desired instance counts (autoscaler.py)."""
