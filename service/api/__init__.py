"""The HTTP API: one package per dialect (its schemas and handlers), the declaration of every
route (`routes.py`), and what handlers share (`context`, `fields`)."""
