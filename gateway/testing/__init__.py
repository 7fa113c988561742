"""Test helpers for plugin authors: the scriptable fake upstream and (as a pytest plugin) fixtures."""
