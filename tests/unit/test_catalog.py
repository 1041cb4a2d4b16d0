"""Catalog: the data files load, every figure carries its source, overrides and shapes resolve."""

from __future__ import annotations

import math
import re

import pytest

from accelbench.api import AcceleratorType, ModelFamily, ModelSource
from accelbench.catalog import (
    CatalogError,
    count_decoder_parameters,
    load_catalog,
    load_model_catalog,
    model_shape,
    parse_price_overrides,
    parse_size,
    resolve_model_shape,
)

DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def test_catalog_has_every_api_accelerator_type() -> None:
    catalog = load_catalog()
    assert set(catalog.accelerators) == {t.value for t in AcceleratorType}
    for name, spec in catalog.accelerators.items():
        assert spec.name == name


def test_every_accelerator_has_a_price_with_source_and_date() -> None:
    for spec in load_catalog().accelerators.values():
        # A figure, or None where none could be cited (then the source says "unpriced"): never a
        # $0 stand-in for an unknown price, which would make every cost ratio against it meaningless.
        if spec.price.on_demand is None:
            assert "unpriced" in spec.price.source.lower(), spec.name
        else:
            assert spec.price.on_demand > 0 or spec.resource_name is None, spec.name
        assert spec.price.source.strip(), spec.name
        assert DATE.match(spec.price.date), spec.name


def test_unverified_prices_say_so() -> None:
    # A figure that was not checked against the provider's own page must say it in its source.
    for spec in load_catalog().accelerators.values():
        if spec.name == "cpu":
            continue
        source = spec.price.source.lower()
        assert "not verified here" in source or "placeholder" in source or "unpriced" in source, spec.name


def test_tpu_topologies_are_consistent() -> None:
    for spec in load_catalog().accelerators.values():
        if not spec.is_tpu:
            assert spec.topologies == []
            continue
        assert spec.default_framework == "jax"
        assert spec.resource_name == "google.com/tpu"
        for t in spec.topologies:
            assert math.prod(int(d) for d in t.topology.split("x")) == t.chips, t
            assert t.hosts * t.chips_per_host == t.chips, t
            assert t.chips_per_host in spec.chips_per_host_options, t


def test_tpu_facts_from_the_docs() -> None:
    catalog = load_catalog()
    v5p = catalog.get("tpu-v5p")
    assert v5p.node_labels == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice"}
    assert (v5p.topology("2x2x1").chips, v5p.topology("2x2x1").hosts) == (4, 1)
    assert (v5p.topology("2x2x2").chips, v5p.topology("2x2x2").hosts) == (8, 2)
    v5e = catalog.get("tpu-v5e")
    assert v5e.node_labels["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5-lite-podslice"
    assert [t.hosts for t in v5e.topologies[:4]] == [1, 1, 1, 4]  # 1x1, 2x2, 2x4 single host; 4x4 on 4
    assert catalog.get("tpu-v6e").topology("4x4").hosts == 4


def test_peak_flops_and_memory_match_anchors() -> None:
    catalog = load_catalog()
    expected = {
        "tpu-v5e": (197, 16),
        "tpu-v5p": (459, 95),
        "tpu-v6e": (918, 32),
        "h100": (989, 80),
        "h100-mega": (989, 80),
        "h200": (989, 141),
        "gaudi2": (432, 96),
        "gaudi3": (1835, 128),
        "a100": (312, 40),
        "a100-80gb": (312, 80),
    }
    for name, (tflops, hbm) in expected.items():
        spec = catalog.get(name)
        assert (spec.peak_tflops["bf16"], spec.hbm_gb) == (tflops, hbm), name
    # Volta: fp16 tensor cores, no bf16; fp32 runs are measured against the 16-bit peak.
    v100 = catalog.get("v100")
    assert v100.peak_tflops == {"fp16": 125} and v100.hbm_gb == 16
    assert not v100.supports("bf16") and v100.supports("fp16") and v100.supports("fp32")
    assert v100.peak_for("fp32") == 125 and v100.serving_peak_tflops == 125
    assert not catalog.get("tpu-v5p").supports("fp16") and catalog.get("h100").peak_for("fp16") == 989


def test_pod_spec_facts() -> None:
    catalog = load_catalog()
    assert catalog.get("h100").node_labels == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert catalog.get("h100-mega").node_labels["cloud.google.com/gke-accelerator"] == "nvidia-h100-mega-80gb"
    assert catalog.get("h200").node_labels["cloud.google.com/gke-accelerator"] == "nvidia-h200-141gb"
    assert catalog.get("h200").resource_name == "nvidia.com/gpu"
    gke = {
        name: catalog.get(name).node_labels["cloud.google.com/gke-accelerator"]
        for name in ("a100", "a100-80gb", "v100")
    }
    assert gke == {"a100": "nvidia-tesla-a100", "a100-80gb": "nvidia-a100-80gb", "v100": "nvidia-tesla-v100"}
    assert catalog.get("v100").images.pytorch is None  # no CUDA 13 torch runs on sm_70: spec.image names one
    assert catalog.get("gaudi3").resource_name == "habana.ai/gaudi"
    assert catalog.get("gaudi3").tolerations[0].key == "habana.ai/gaudi"
    assert catalog.get("cpu").resource_name is None
    assert any("nominal" in note for note in catalog.get("cpu").notes)


def test_each_accelerator_names_its_default_framework() -> None:
    """The planner resolves a missing spec.framework from these (plan.common.framework_for)."""
    catalog = load_catalog()
    assert catalog.get("tpu-v6e").default_framework == "jax"
    assert catalog.get("h100").default_framework == "pytorch"
    assert catalog.get("gaudi2").default_framework == "pytorch"
    assert catalog.get("cpu").default_framework == "pytorch"


def test_unknown_accelerator_lists_known_ones() -> None:
    with pytest.raises(KeyError, match="tpu-v5p"):
        load_catalog().get("tpu-v9")


# ---------------------------------------------------------------- price overrides


def test_price_override_from_configmap() -> None:
    data = {"prices.yaml": "h100: {onDemand: 9.5, spot: 3.5, source: negotiated rate, date: 2026-11-30}\n"}
    overrides = parse_price_overrides(data)
    assert overrides == {
        "h100": {"on_demand": 9.5, "spot": 3.5, "source": "negotiated rate", "date": "2026-11-30"}
    }
    price = load_catalog(overrides).get("h100").price
    assert (price.on_demand, price.spot, price.source, price.date) == (
        9.5,
        3.5,
        "negotiated rate",
        "2026-11-30",
    )
    # Other accelerators and the cached base catalog are untouched.
    assert load_catalog(overrides).get("h200").price == load_catalog().get("h200").price
    assert load_catalog().get("h100").price.on_demand == 11.06


def test_partial_override_drops_the_catalog_source() -> None:
    price = load_catalog({"tpu-v5p": {"spot": 1.5}}).get("tpu-v5p").price
    assert price.spot == 1.5
    assert price.on_demand == 4.20
    assert price.source == "price override (no source given)"


def test_override_for_unknown_accelerator_is_refused() -> None:
    with pytest.raises(CatalogError, match="unknown accelerator 'h300'"):
        load_catalog({"h300": {"on_demand": 1.0}})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "no 'prices.yaml' key"),
        ({"other": "x"}, "no 'prices.yaml' key"),
        ({"prices.yaml": "h100: [1, 2"}, "not valid YAML"),
        ({"prices.yaml": "- h100\n- h200\n"}, "must map accelerator names"),
        ({"prices.yaml": "h100: 11.06\n"}, "must be a mapping"),
        ({"prices.yaml": "h100: {onDemand: -1}\n"}, r"number of \$/chip-hour from 0 to 1000"),
        ({"prices.yaml": "h100: {onDemand: cheap}\n"}, r"number of \$/chip-hour from 0 to 1000"),
        ({"prices.yaml": "h100: {onDemand: yes}\n"}, r"number of \$/chip-hour from 0 to 1000"),
        ({"prices.yaml": "h100: {onDemand: .nan}\n"}, r"number of \$/chip-hour from 0 to 1000"),
        ({"prices.yaml": "h100: {onDemand: 1e308}\n"}, "from 0 to 1000"),  # once made the cost infinite
        ({"prices.yaml": "h100: {on_demand: 1}\n"}, "unknown fields"),
        ({"prices.yaml": "h100: {}\n"}, "sets no field"),
    ],
)
def test_parse_price_overrides_garbage(data: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_price_overrides(data)


def test_parse_price_overrides_empty_document() -> None:
    assert parse_price_overrides({"prices.yaml": ""}) == {}


# ---------------------------------------------------------------- model shapes


def test_every_family_has_a_tiny_test_shape() -> None:
    families = load_model_catalog().families
    for family in ModelFamily:
        tiny = families[family.value]["tiny"]
        assert tiny.parameters < 20_000_000


def test_shapes_agree_with_their_parameter_counts() -> None:
    # The decoder recomputed from the shape, plus any vision tower, must match the published total
    # within 0.5 %; a typo in layers or widths would be off by far more.
    for sizes in load_model_catalog().families.values():
        for shape in sizes.values():
            computed = count_decoder_parameters(shape) + shape.extra_parameters
            assert abs(computed / shape.parameters - 1) < 0.005, (shape.name, computed, shape.parameters)


def test_gemma3_layer_pattern() -> None:
    shape = model_shape("gemma3", "1b")
    # Five sliding-window layers, then one global: layers 6, 12, 18, 24 (1-based) of 26.
    assert [i for i in range(shape.layers) if shape.is_global_layer(i)] == [5, 11, 17, 23]
    assert (shape.local_layers, shape.global_layers) == (22, 4)


def test_gemma4_31b_global_layers_have_their_own_heads() -> None:
    shape = model_shape("gemma4", "31b")
    assert shape.global_layers == 10
    assert shape.layer_heads(True) == (4, 512)
    assert shape.layer_heads(False) == (16, 256)


def test_resolve_known_size() -> None:
    shape = resolve_model_shape(ModelSource(uri="pvc://m", family="llama", size="8B"))
    assert (shape.layers, shape.hidden, shape.kv_heads, shape.parameters) == (32, 4096, 8, 8_030_261_248)
    assert not shape.approximate


def test_parameters_override_the_catalog_count() -> None:
    shape = resolve_model_shape(
        ModelSource(uri="pvc://m", family="gemma3", size="27b", parameters=27_000_000_000)
    )
    assert shape.parameters == 27_000_000_000
    assert shape.layers == 62


def test_unknown_size_derives_an_approximate_shape() -> None:
    shape = resolve_model_shape(ModelSource(uri="pvc://m", family="qwen", size="14b"))
    assert shape.approximate
    assert shape.parameters == 14_000_000_000
    assert "not in the catalog" in (shape.note or "")
    assert shape.vocab == 152064  # the family's vocabulary is kept
    # The derived body is the smallest that reaches the count, so it is close to it.
    assert 1.0 <= count_decoder_parameters(shape) / 14e9 < 1.25


def test_parameters_alone_derive_a_shape() -> None:
    shape = resolve_model_shape(ModelSource(uri="pvc://m", family="mistral", parameters=7_000_000_000))
    assert shape.approximate
    assert shape.size == "7b"


def test_no_size_and_no_parameters_is_an_error() -> None:
    with pytest.raises(CatalogError, match="needs a size or a parameter count"):
        resolve_model_shape(ModelSource(uri="pvc://m", family="gemma3"))


@pytest.mark.parametrize(
    ("size", "count"), [("31b", 31_000_000_000), ("270m", 270_000_000), ("0.5B", 500_000_000)]
)
def test_parse_size(size: str, count: int) -> None:
    assert parse_size(size) == count


@pytest.mark.parametrize("size", ["", "b", "12", "1.2.3b", "-1b", "0b"])
def test_parse_size_garbage(size: str) -> None:
    with pytest.raises(CatalogError):
        parse_size(size)


def test_image_overrides_parse_and_apply() -> None:
    from accelbench.catalog import load_catalog, parse_image_overrides

    data = {"prices.yaml": "{}", "images.yaml": "h200: {pytorch: my/torch:1, transformers: my/torch:1}\n"}
    images = parse_image_overrides(data)
    assert images == {"h200": {"pytorch": "my/torch:1", "transformers": "my/torch:1"}}
    assert load_catalog(image_overrides=images).get("h200").images.pytorch == "my/torch:1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1]", "must map accelerator names"),
        ("h100: {pytroch: x}", "unknown roles"),
        ("h100: {pytorch: ''}", "non-empty string"),
        ("h100: [", "not valid YAML"),
    ],
)
def test_bad_image_overrides_say_what_is_wrong(text: str, message: str) -> None:
    from accelbench.catalog import parse_image_overrides

    with pytest.raises(ValueError, match=message):
        parse_image_overrides({"images.yaml": text})


def test_image_override_for_an_unknown_accelerator_is_refused() -> None:
    from accelbench.catalog import CatalogError, load_catalog

    with pytest.raises(CatalogError, match="unknown accelerator"):
        load_catalog(image_overrides={"b200": {"pytorch": "x"}})


@pytest.mark.parametrize("size", ["1" * 400 + "b", "2000000b", "0b", "infb", "nanb"])
def test_a_size_no_model_has_is_a_catalog_error_not_an_overflow(size: str) -> None:
    """400 digits once raised OverflowError out of the planner (issue 15); admission now also caps
    the field's length."""
    from accelbench.catalog import parse_size

    with pytest.raises(CatalogError, match="is not a count"):
        parse_size(size)
