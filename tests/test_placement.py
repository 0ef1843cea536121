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


def test_cycle_slides_a_device_window_of_gpu_layers_across_the_trunk():
    """`--gpu-layers 8 --cycle` is `--window-layers 8` on the device; --gpu-layers alone and with
    --first-layer keep their fixed ranges."""
    cycled = plan_placement(30, None, 8, 0, "cuda", cycle=True)
    assert cycled == plan_placement(30, 8, -1, 0, "cuda") and describe(cycled).startswith("cuda [0..8) [8..16)")
    assert plan_placement(30, 8, 8, 0, "cuda", cycle=True) == cycled          # the same size said twice
    assert describe(plan_placement(30, 8, 8, 0, "cuda")) == "cuda [0..8), cpu [8..30)"
    assert describe(plan_placement(30, 4, -1, 0, "cuda", cycle=True)).startswith("cuda [0..4) [4..8)")


@pytest.mark.parametrize("window_layers, gpu_layers, first_layer, message", [
    (None, 8, 4, "--first-layer 4 fixes where it stands: give one of them"),
    (4, 8, 0, "--gpu-layers 8 --cycle slides windows of 8 layers; --window-layers 4 asks for another size"),
    (None, 0, 0, "--gpu-layers 0 --cycle slides a window of no layers"),
])
def test_contradictory_cycle_flags_are_refused(window_layers, gpu_layers, first_layer, message):
    with pytest.raises(UserError, match=message):
        plan_placement(30, window_layers, gpu_layers, first_layer, "cuda", cycle=True)


def test_windows_that_do_not_tile_are_an_error():
    with pytest.raises(UserError, match="do not tile"):
        check_tiling([Window("cpu", 0, 4), Window("cpu", 5, 30)], 30)


def test_window_layers_and_device_memory_are_parsed():
    from pipeline.run.placement import parse_window_layers
    from pipeline.run.preflight import parse_size

    assert parse_window_layers("auto") is None and parse_window_layers("8") == 8 and parse_window_layers(0) == 0
    for bad in ("-1", "four"):
        with pytest.raises(UserError, match="--window-layers"):
            parse_window_layers(bad)
    assert parse_size("12GiB") == 12 * 2**30 and parse_size("1.5 gib") == 3 * 2**29 and parse_size("512MiB") == 2**29
    for bad in ("12", "12GB", "0GiB", "-1GiB", "GiB"):
        with pytest.raises(UserError, match="--device-memory"):
            parse_size(bad)


def test_auto_windows_are_the_longest_that_fit_the_budget():
    from pipeline.run.placement import pack_windows

    per_layer = [3, 3, 1, 1, 1, 5, 1, 1]                  # a big layer among small ones
    windows = pack_windows(per_layer, fixed=2, budget=8, first=0, last=8, device="cuda")
    assert [(w.first, w.last) for w in windows] == [(0, 2), (2, 5), (5, 7), (7, 8)]
    assert all(sum(per_layer[w.first:w.last]) + 2 <= 8 for w in windows)
    with pytest.raises(UserError, match=r"layer 5 on cuda needs about .* but --device-memory is"):
        pack_windows(per_layer, fixed=2, budget=6, first=0, last=8, device="cuda", what="--device-memory")


def test_the_cpu_part_of_a_split_is_cycled_too():
    def pack(device, first, last):   # stands in for the budgets: 3 layers a window on the CPU, 2 on the GPU
        size = 3 if device == "cpu" else 2
        return [Window(device, a, min(a + size, last)) for a in range(first, last, size)]

    windows = plan_placement(20, None, 6, 4, "cuda", pack)
    assert describe(windows) == "cpu [0..3) [3..4), cuda [4..6) [6..8) [8..10), cpu [10..13) [13..16) [16..19) [19..20)"
    windows = plan_placement(20, 3, 6, 4, "cuda", pack)     # --window-layers sizes the GPU part only
    assert describe(windows) == "cpu [0..3) [3..4), cuda [4..7) [7..10), cpu [10..13) [13..16) [16..19) [19..20)"


def test_auto_windows_do_not_depend_on_free_memory(monkeypatch, tmp_path):
    """A rerun after a crash must plan the windows the first run made, whatever memory is free
    then: auto sizing follows the device's total memory (or --device-memory), never its free memory."""
    from pipeline import PerplexityRun
    from pipeline.run import preflight

    run = PerplexityRun(model="smollm2-135m", device="cpu", run_root=str(tmp_path), device_memory="900MiB")
    first = run.placement(check_memory=False)
    assert len(first) > 1                                         # 900 MiB holds part of the trunk
    monkeypatch.setattr(preflight, "available_bytes", lambda device: 2**40)
    assert run.placement(check_memory=False) == first
    monkeypatch.setattr(preflight, "total_bytes", lambda device: 2**40)
    assert run.placement(check_memory=False) == first              # --device-memory decides
    auto = PerplexityRun(model="smollm2-135m", device="cpu", run_root=str(tmp_path))
    assert len(auto.placement(check_memory=False)) == 1            # a share of 1 TiB holds it all


def test_a_second_host_reuses_the_windows_the_first_planned(monkeypatch, tmp_path):
    """Auto windows without --device-memory follow the memory of the host that plans them; a
    worker on a host with other memory, sharing the run root, takes the recorded windows."""
    from pipeline import PerplexityRun
    from pipeline.run import preflight

    def host_with(total: int):
        monkeypatch.setattr(preflight, "total_bytes", lambda device: total)
        return PerplexityRun(model="smollm2-135m", device="cpu", run_root=str(tmp_path), sequences_per_chunk=4)

    small = host_with(1200 * 2**20).placement(check_memory=False)
    assert len(small) > 1
    assert host_with(2**40).placement(check_memory=False) == small
    elsewhere = PerplexityRun(model="smollm2-135m", device="cpu", run_root=str(tmp_path / "other"))
    assert len(elsewhere.placement(check_memory=False)) == 1       # another run root plans anew


def test_the_first_record_stands_where_the_file_system_has_no_hard_links(monkeypatch, tmp_path):
    import errno
    import os

    from pipeline.store import outputs

    def no_links(src, dst):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / ".placements" / "a.json"
    assert outputs.record_once(path, {"placement": "cpu:0:15,cpu:15:30"}) == {"placement": "cpu:0:15,cpu:15:30"}
    assert outputs.record_once(path, {"placement": "cpu:0:30"}) == {"placement": "cpu:0:15,cpu:15:30"}
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.json"]   # no temporary file left


def test_writers_of_one_record_never_share_a_temporary_file(tmp_path):
    """Hosts starting one sweep write its .sweeps record at once: each writer's temporary file is
    its own, so every write lands whole and none fails."""
    import json
    import threading

    from pipeline.store import outputs

    path, failures = tmp_path / ".sweeps" / "digest.json", []
    path.parent.mkdir()

    def writer(k: int) -> None:
        try:
            for n in range(40):
                outputs.write_json(path, {"writer": k, "runs": list(range(n * 50))})
        except OSError as e:
            failures.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert json.loads(path.read_text())["runs"] == list(range(39 * 50))
    assert sorted(p.name for p in path.parent.iterdir()) == ["digest.json"]
