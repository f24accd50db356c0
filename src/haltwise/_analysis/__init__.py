"""Faces that judge a task's tools: the policy audit and the cancel-at-every-point explorer."""
