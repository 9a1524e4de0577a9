"""The bundle manifest: one typed contract that export writes and the service reads."""

from __future__ import annotations

import json
import shutil

import pytest

from service.bundle import BundleError, load_bundle
from service.manifest import FORMAT_VERSION, Manifest


def test_the_exported_manifest_validates_and_round_trips(tiny_bundle):
    raw = (tiny_bundle / "manifest.json").read_text()
    manifest = Manifest.model_validate_json(raw)
    assert manifest.format == FORMAT_VERSION
    assert Manifest.model_validate_json(manifest.model_dump_json()) == manifest
    assert manifest.files()["tokenizer.json"] == manifest.tokenizer.sha256
    assert manifest.dimensions == manifest.d_model == 32


def test_a_field_the_reader_does_not_know_is_refused_naming_it(tiny_bundle, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    data = json.loads((bundle / "manifest.json").read_text())
    data["surprise"] = 1
    (bundle / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="surprise"):
        load_bundle(bundle)


def test_a_missing_field_is_refused_naming_it(tiny_bundle, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle, bundle)
    data = json.loads((bundle / "manifest.json").read_text())
    del data["max_length"]
    (bundle / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="max_length"):
        load_bundle(bundle)
