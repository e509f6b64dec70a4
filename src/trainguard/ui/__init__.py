"""`trainguard ui`: a read-only web dashboard over job stores (docs/ui.md).

catalog (which jobs), eventlog (bounded event reads), jobs (the views' data), logtail and
logview (rank logs, never read whole), hangs (stack dumps), stream (server-sent events),
auth (loopback and the token), app (routes), server (uvicorn); static/ holds the pages.
"""
