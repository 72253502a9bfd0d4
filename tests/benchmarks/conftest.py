"""Markers of this folder's tests (registered here too, so the folder runs alone)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than 60 s (a real server under load)")
