import amp


def test_version_is_a_string():
    assert isinstance(amp.__version__, str) and amp.__version__.count(".") == 2
