"""Task output folders with atomic completion.

A task writes into `<out>.partial/` (kept across crashes, so work done chunk by chunk can be
resumed) and completes by writing `manifest.json` there and renaming the folder to `<out>/`.
A folder without its manifest is never taken as complete.
"""
import json
import os
import shutil
from pathlib import Path

MANIFEST = "manifest.json"


def partial_dir(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def begin(out: Path, params: dict) -> Path:
    if out.exists():  # an earlier output whose data was removed: it is being recomputed
        shutil.rmtree(out)
    work = partial_dir(out)
    work.mkdir(parents=True, exist_ok=True)
    write_json(work / "params.json", params)
    return work


def commit(out: Path, manifest: dict) -> None:
    work = partial_dir(out)
    write_json(work / MANIFEST, manifest)
    os.replace(work, out)


def is_complete(out: Path) -> bool:
    return (out / MANIFEST).is_file()


def read_manifest(out: Path) -> dict:
    return json.loads((out / MANIFEST).read_text())


def remove_data(out: Path, name: str, flag: str) -> None:
    """Delete `out/name`, recording it in the manifest first so the output reads incomplete."""
    manifest = read_manifest(out)
    write_json(out / MANIFEST, {**manifest, flag: True})
    shutil.rmtree(out / name, ignore_errors=True)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
