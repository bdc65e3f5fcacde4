"""What tests/ and examples/ share; tests-only helpers are in tests/conftest.py."""

# pytester runs the inner pytest sessions of the plugin's own tests.
pytest_plugins = ["pytester"]
