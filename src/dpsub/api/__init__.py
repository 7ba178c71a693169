"""The Python API (the tier between the library core and the front ends, ``dpsub.cli`` and
``dpsub.experiments``): a placeholder for now; tests/unit/test_architecture.py keeps its
place in the layers."""
