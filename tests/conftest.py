import os

import pytest

from pipeline.gguf_io.registry import fetch_model

if os.environ.get("PYTEST_XDIST_WORKER"):
    # one core per worker (pyproject's -n), for its own computations and the commands it starts
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    import torch
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def exact_numerics():
    """Each test starts in exact numerics: a pass in llama-cpp numerics sets them for its process."""
    yield
    from pipeline.numerics import set_numerics
    set_numerics("exact", "llama")


@pytest.fixture(scope="session")
def model_path():
    """Path of a registered real model, fetched into data/models/ on first use."""
    return fetch_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """(Hugging Face model, GGUF path) of a tiny random model, built and converted once per session:
    its workers (pyproject's -n) share the files, each holding the model itself."""
    from .hf_models import tiny_model as build

    session = tmp_path_factory.getbasetemp()
    shared = (session.parent if os.environ.get("PYTEST_XDIST_WORKER") else session) / "tiny-models"
    scratch, built = tmp_path_factory.mktemp("tiny-models-again"), {}

    def get(name: str, outtype: str = "f32"):
        if (name, outtype) not in built:
            built[name, outtype] = build(name, shared, scratch, outtype)
        return built[name, outtype]
    return get


def pytest_collection_modifyitems(config, items):
    """The tests of one tiny model (a parameter naming it, or a feature of it: "glm5next selection
    bias") share an xdist group (pyproject's --dist loadgroup): one worker builds the model and
    runs them, while another builds another, instead of waiting on the first one's lock."""
    from pipeline.tools.architectures import MATRIX

    from .hf_models import SPECS

    names = set(SPECS) | {m.name for m in MATRIX}
    for item in items:
        callspec = getattr(item, "callspec", None)
        firsts = [v.split(" ")[0] for v in (callspec.params.values() if callspec else ()) if isinstance(v, str)]
        if item.get_closest_marker("xdist_group") is None and (member := next((f for f in firsts if f in names), None)):
            item.add_marker(pytest.mark.xdist_group(member))
