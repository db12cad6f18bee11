"""Not imported: makes setuptools ship sitecustomize.py with the kit (this dir goes on PYTHONPATH)."""
