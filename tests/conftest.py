import pytest

from pipeline.gguf_io.registry import fetch_model


@pytest.fixture(scope="session")
def model_path():
    """Path of a registered real model, fetched into data/models/ on first use."""
    return fetch_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """(Hugging Face model, GGUF path) of a tiny random model, built and converted once per session."""
    from .hf_models import tiny_model as build

    root, built = tmp_path_factory.mktemp("tiny-models"), {}

    def get(name: str, outtype: str = "f32"):
        if (name, outtype) not in built:
            built[name, outtype] = build(name, root, outtype)
        return built[name, outtype]
    return get
