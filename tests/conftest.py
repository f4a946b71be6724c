import pytest

import tests.profiles  # noqa: F401  (registers and loads the hypothesis profiles)


@pytest.fixture(scope="session")
def spark():
    """One real local[2] SparkSession for the Spark tests of this session (of each pytest-xdist worker)."""
    from skpub.app.engines.spark import spark_session

    session = spark_session("local[2]", 4, app_name="skpub-tests")
    yield session
    session.stop()
