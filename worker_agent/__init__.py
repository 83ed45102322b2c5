"""Worker-cluster agent: inbox, reconcilers (render -> apply), status reports, capacity and GC."""
