# Put first on the test cluster's PYTHONPATH (tests/ray/conftest.py): every Ray process imports
# jsonschema, which imports rfc3987_syntax when it is installed (jupyterlab brings it), and that
# import builds Earley parsers for 3 s of CPU. Twenty Ray processes doing it on a 2-core machine
# push the dashboard agent past the raylet's fixed 15 s start-up wait and the node fails to start.
# jsonschema skips its "iri" format check when this import fails; nothing of ours uses it.
raise ImportError("rfc3987_syntax is kept out of the test cluster's processes")
