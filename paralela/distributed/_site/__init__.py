"""Put on every rank's ``PYTHONPATH`` by ``paralela launch``: its ``sitecustomize`` tells
the launcher when the rank enters and leaves ``init_process_group`` (see
:mod:`paralela.distributed._joining`)."""
