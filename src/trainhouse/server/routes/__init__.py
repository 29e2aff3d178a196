"""One module per resource: system (health, nodes, schema), jobs, report (the SDK's endpoints)."""
