import pytest

from pipeline.errors import UserError
from pipeline.run.placement import Window, check_tiling, describe, plan_placement


def test_cycling_windows_tile_the_trunk():
    windows = plan_placement(30, 4, -1, 0, "cpu")
    assert [(w.first, w.last) for w in windows][-2:] == [(24, 28), (28, 30)]
    assert describe(windows).startswith("cpu [0..4) [4..8)")
    check_tiling(windows, 30)


def test_whole_trunk_is_one_window():
    assert plan_placement(18, 0, -1, 0, "cpu") == [Window("cpu", 0, 18)]


def test_gpu_layers_with_first_layer():
    windows = plan_placement(30, 8, 16, 4, "cuda")
    assert describe(windows) == "cpu [0..4), cuda [4..12) [12..20), cpu [20..30)"


def test_gpu_layers_beyond_the_trunk_is_an_error():
    with pytest.raises(UserError, match="does not fit"):
        plan_placement(30, 4, 28, 4, "cuda")


def test_windows_that_do_not_tile_are_an_error():
    with pytest.raises(UserError, match="do not tile"):
        check_tiling([Window("cpu", 0, 4), Window("cpu", 5, 30)], 30)
