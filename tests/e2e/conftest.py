"""Real-engine end-to-end tests (the shared fixtures are tests/conftest.py's)."""


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "slow: takes more than 60 s (a real engine run or several)")
