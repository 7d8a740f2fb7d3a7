"""A session on one thread: ops, the recorder, tools offered, following and resuming turns."""
