"""Maintenance scripts for the repository (not part of the package): `python -m scripts.NAME`."""
