"""Kernel catalogs: loading, validation, first-match classification, auto-pick, frame classification."""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from profkit.analysis.catalog import Catalog, auto_catalog, catalog_dir, catalog_names, load_catalog
from profkit.errors import UsageError

from support import ROOT, needs_public, public_steps

REPO = ROOT
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")




def _write(tmp_path: Path, text: str, name: str = "cat.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


MINIMAL = """
name = "t"
[[rule]]
category = "memcpy"
cats = ["gpu_memcpy"]
[[rule]]
category = "first"
pattern = 'foo'
[[rule]]
category = "second"
pattern = 'foobar'
"""

# ----------------------------------------------------------------------------------- shipping


def test_shipped_catalogs_include_generic_proxy_and_sglang_glm52():
    assert {"generic", "proxy", "sglang-glm52"} <= set(catalog_names())
    assert catalog_dir() == REPO / "kernels"


@pytest.mark.parametrize("name", catalog_names())
def test_every_shipped_catalog_loads_and_is_named_after_its_file(name):
    c = load_catalog(name)
    assert isinstance(c, Catalog)
    assert c.name == name
    assert Path(c.source) == catalog_dir() / f"{name}.toml"
    assert c.rules
    assert c.default_category == "other"
    for rule in c.rules:
        assert rule.owner is None or rule.owner in c.optimizations
    for cats in c.optimizations.values():
        assert set(cats) <= set(c.categories)


def test_load_catalog_by_path_equals_by_name():
    by_path = load_catalog(REPO / "kernels" / "generic.toml")
    by_str = load_catalog(str(REPO / "kernels" / "generic.toml"))
    assert by_path == by_str == load_catalog("generic")


def test_catalogs_are_hashable_and_cache_per_instance():
    c = load_catalog("generic")
    assert hash(c) == hash(c)
    assert c.classify("nvjet_tst_64x8") is c.classify("nvjet_tst_64x8")


def test_category_sets_of_shipped_catalogs():
    assert load_catalog("sglang-glm52").categories == (
        "memcpy", "comm", "spec", "moe", "topk", "indexer", "attention", "gemm", "rope", "norm", "quant", "sampling", "other",
    )  # fmt: skip
    assert load_catalog("generic").categories == (
        "memcpy", "comm", "moe", "attention", "sampling", "topk", "gemm", "rope", "norm", "quant", "reduce", "elementwise", "other",
    )  # fmt: skip
    assert set(load_catalog("proxy").categories) == {
        "indexer", "topk", "attention", "moe", "gemm", "norm", "rope", "sampling", "memcpy", "comm", "reduce", "elementwise", "other",
    }  # fmt: skip


def test_sglang_glm52_declares_the_study_optimizations():
    opts = load_catalog("sglang-glm52").optimizations
    for name in ("overlap", "topk_v2", "indexer_fusion", "index_share", "draft_extend_graph", "cuda_graph", "bf16_gemm", "moe_deferred_finalize"):
        assert name in opts
    assert opts["overlap"] == () and opts["cuda_graph"] == ()
    assert opts["topk_v2"] == ("topk",)
    assert opts["bf16_gemm"] == ("gemm",)


# ----------------------------------------------------------------------------------- semantics


def test_first_match_wins(tmp_path):
    c = load_catalog(_write(tmp_path, MINIMAL))
    assert c.classify("foobar_kernel") == ("first", None)
    assert c.classify("nothing") == ("other", None)


def test_memcpy_by_cat_whatever_the_name(tmp_path):
    c = load_catalog(_write(tmp_path, MINIMAL))
    assert c.classify("foobar", "gpu_memcpy") == ("memcpy", None)
    for name in ("generic", "sglang-glm52", "proxy"):
        cat = load_catalog(name)
        assert cat.classify("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy")[0] == "memcpy"
        assert cat.classify("Memset (Device)", "gpu_memset")[0] == "memcpy"


def test_rule_with_several_matchers_needs_all(tmp_path):
    c = load_catalog(
        _write(
            tmp_path,
            """
name = "t"
[[rule]]
category = "both"
pattern = 'gemm'
annotation = '^proxy\\.moe'
[[rule]]
category = "ann"
annotation = '^proxy\\.moe'
""",
        )
    )
    assert c.classify("gemm_kernel", "kernel", "proxy.moe.experts") == ("both", None)
    assert c.classify("add_kernel", "kernel", "proxy.moe") == ("ann", None)
    assert c.classify("gemm_kernel", "kernel", None) == ("other", None)
    assert c.classify("gemm_kernel", "kernel", "proxy.attention") == ("other", None)


SGLANG_EXAMPLES = [
    # (name, cat, expected category, expected owner) -- shared/docs/sglang-0.5.23.md §4
    ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", "memcpy", None),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}>>(int)", "kernel", "memcpy", None),
    ("moe_finalize_all_reduce_kernel", "kernel", "comm", "moe_deferred_finalize"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "kernel", "comm", None),
    ("void sglang::all_reduce_1shot_push_kernel<__nv_bfloat16, 8>(...)", "kernel", "comm", None),
    ("_fused_dsa_draft_extend_metadata_kernel", "kernel", "spec", "spec"),
    ("void speculative::build_tree_efficient(long*, int*)", "kernel", "spec", "spec"),
    ("assign_draft_cache_locs_contiguous", "kernel", "spec", "spec"),
    ("void moeFinalizeKernelVecLoad<__nv_bfloat16, 8>(...)", "kernel", "moe", "moe_deferred_finalize"),
    ("void moe::dev::finalize::finalizeKernelVecLoad<moe::dev::finalize::KernelParams<cutlass::bfloat16_t>>(...)", "kernel", "moe", None),
    ("bmm_E2m1_E2m1E2m1_Fp32_t128x8x512u2_s3_et128x8_sm100f", "kernel", "moe", None),
    ("void sglang::topk_main_kernel<true, 0>(int const*, float const*, int*)", "kernel", "topk", "topk_v2"),
    ("void sglang::topk_plan_cluster<4>(...)", "kernel", "topk", "topk_v2"),
    ("void topk_transform_decode_kernel<2048>(float const*, int*)", "kernel", "topk", None),
    ("fast_topk_v2", "kernel", "topk", None),
    ("fused_k_indexer_norm_rope_store", "kernel", "indexer", "indexer_fusion"),
    ("void fused_q_indexer_rope_hadamard_quant<128>(...)", "kernel", "indexer", "indexer_fusion"),
    ("void deep_gemm::sm90_fp8_paged_mqa_logits<64, 128, 4>(unsigned int, float*)", "kernel", "indexer", None),
    ("_act_quant_kernel", "kernel", "indexer", None),
    ("_fused_dsa_decode_metadata_kernel", "kernel", "indexer", None),
    ("void flash_fwd_splitkv_mla_fp8_sparse_kernel<cutlass::bfloat16_t>(...)", "kernel", "attention", None),
    ("fmhaSm100fKernel_QkvE4m3OBfloat16HQk576HV512SparseP64", "kernel", "attention", None),
    ("nvjet_sm90_tst_128x64_64x8_1x1_v_bz_TNT", "kernel", "gemm", None),
    ("kernel_cutlass_kernel_sglangkernelsopsgemmcutedsl_bf16_gemmTgvGemmCuteExtKernel_object_at_0x7f12", "kernel", "gemm", "bf16_gemm"),
    ("fusedQKNormRopeKernel", "kernel", "rope", None),
    ("void rmsnorm_cta<__nv_bfloat16>(...)", "kernel", "norm", None),
    ("void per_token_group_quant_8bit_v2_kernel<...>(...)", "kernel", "quant", None),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4>>(...)", "kernel", "sampling", None),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>>(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)", "kernel", "other", None),
    ("main_kernel", "kernel", "other", None),
]


@pytest.mark.parametrize(("name", "cat", "category", "owner"), SGLANG_EXAMPLES)
def test_sglang_glm52_classifies_the_doc_examples(name, cat, category, owner):
    assert load_catalog("sglang-glm52").classify(name, cat) == (category, owner)


GENERIC_EXAMPLES = [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>>(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float>>, unsigned int, float, 4>>(...)", "reduce"),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(...)", "topk"),
    ("void at::native::bitonicSortKVInPlace<2, -1, 16, 16, float, long>(...)", "topk"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>(...)", "sampling"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(...)", "norm"),
    ("void at::native::index_elementwise_kernel<128, 4>(long, ...)", "elementwise"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(...)", "gemm"),
    ("triton_tem_fused_mm_0", "gemm"),
    ("triton_poi_fused_add_mul_0", "elementwise"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "norm"),
    ("triton_red_fused_sum_1", "reduce"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4>>(...)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)", "attention"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "comm"),
    ("Memcpy HtoD (Pageable -> Device)", "memcpy"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<int, unsigned int, 1, 128, 1>(...)", "memcpy"),
]


@pytest.mark.parametrize(("name", "category"), GENERIC_EXAMPLES)
def test_generic_classifies_aten_cublas_triton_nccl_attention(name, category):
    assert load_catalog("generic").classify(name)[0] == category


def test_only_the_proxy_catalog_needs_annotations():
    assert load_catalog("proxy").uses_annotations
    assert not load_catalog("generic").uses_annotations
    assert not load_catalog("sglang-glm52").uses_annotations


def test_proxy_uses_ranges_and_gives_owners_by_kernel_name():
    c = load_catalog("proxy")
    assert c.classify("topk_v2_radix_select", "kernel", "proxy.indexer.topk") == ("topk", "topk_v2")
    assert c.classify("void at::native::sbtopk::gatherTopK<float>(...)", "kernel", "proxy.indexer.topk") == ("topk", None)
    assert c.classify("indexer_k_fused_norm_rope", "kernel", "proxy.indexer.prologue") == ("indexer", "indexer_fusion")
    assert c.classify("nvjet_tst_64x8", "kernel", "proxy.indexer.prologue") == ("indexer", None)
    assert c.classify("nvjet_tst_64x8", "kernel", "proxy.attention") == ("attention", None)
    assert c.classify("nvjet_tst_64x8", "kernel", "proxy.moe") == ("moe", None)
    # no "spec" category (issue 19): the MTP head's GEMM is a GEMM, a draft argmax is sampling; where is the phase
    assert c.classify("nvjet_tst_64x8", "kernel", "proxy.mtp") == ("gemm", None)
    assert c.classify("argmax", "kernel", "draft_extend") == ("sampling", None)
    assert c.classify("nvjet_tst_64x8", "kernel", "proxy.qkv_proj") == ("gemm", None)
    assert c.classify("void at::native::reduce_kernel<ArgMaxOps<float>>", "kernel", "step[DECODE bs=1]") == ("sampling", None)
    assert c.classify("nvjet_tst_64x8", "kernel", None) == ("gemm", None)
    assert c.classify("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", "proxy.attention") == ("memcpy", None)


# ----------------------------------------------------------------------------------- auto-pick


def test_auto_catalog_picks_sglang_glm52_for_dsa_kernels():
    names = ["void at::native::vectorized_elementwise_kernel<4>(int)", "void sglang::topk_main_kernel<true, 0>(...)"]
    assert auto_catalog(names).name == "sglang-glm52"


def test_auto_catalog_falls_back_to_generic_for_plain_aten():
    names = [
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)",
        "void at::native::reduce_kernel<512, 1>(...)",
        "nvjet_tst_64x8_64x16_1x1_v_bz_TNT",
    ]
    assert auto_catalog(names).name == "generic"
    assert auto_catalog([]).name == "generic"


def test_auto_catalog_picks_proxy_for_its_triton_kernels():
    assert auto_catalog(["topk_v2_radix_select", "indexer_q_fused_rope_quant", "nvjet_x"]).name == "proxy"


# ----------------------------------------------------------------------------------- frames


def test_classify_frame_matches_classify_on_100k_rows_with_50_unique_names():
    c = load_catalog("sglang-glm52")
    uniq = [(n, cat) for n, cat, _, _ in SGLANG_EXAMPLES] + [(f"some_kernel_{i}", "kernel") for i in range(50 - len(SGLANG_EXAMPLES))]
    assert len(uniq) == 50
    n_rows = 100_000
    names = [uniq[(i * 7) % 50][0] for i in range(n_rows)]
    cats = [uniq[(i * 7) % 50][1] for i in range(n_rows)]
    df = pl.DataFrame(
        {"name": names, "cat": cats, "dur_us": list(range(n_rows))},
        schema={"name": pl.String, "cat": pl.Categorical, "dur_us": pl.Int64},
    )
    out = c.classify_frame(df)
    assert out.columns == ["name", "cat", "dur_us", "category", "owner"]
    assert out.schema["category"] == pl.String and out.schema["owner"] == pl.String
    assert out["dur_us"].to_list() == list(range(n_rows))  # order kept
    expected = {u: c.classify(*u) for u in uniq}
    assert out["category"].to_list() == [expected[(n, k)][0] for n, k in zip(names, cats)]
    assert out["owner"].to_list() == [expected[(n, k)][1] for n, k in zip(names, cats)]


def test_classify_frame_uses_annotation_and_null_annotation():
    c = load_catalog("proxy")
    df = pl.DataFrame(
        {
            "name": ["nvjet_a", "nvjet_a", "nvjet_a", "topk_v2_select"],
            "cat": ["kernel"] * 4,
            "annotation": ["proxy.moe", None, "proxy.attention", None],
        }
    )
    out = c.classify_frame(df)
    assert out["category"].to_list() == ["moe", "gemm", "attention", "topk"]
    assert out["owner"].to_list() == [None, None, None, "topk_v2"]


def test_classify_frame_on_an_empty_frame():
    out = load_catalog("generic").classify_frame(pl.DataFrame(schema={"name": pl.String, "cat": pl.String}))
    assert out.height == 0 and out.columns == ["name", "cat", "category", "owner"]


# ----------------------------------------------------------------------------------- errors


def test_unknown_catalog_name_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown kernel catalog 'nope'") as e:
        load_catalog("nope")
    assert "generic" in (e.value.hint or "")


def test_missing_catalog_file_names_the_file(tmp_path):
    p = tmp_path / "missing.toml"
    with pytest.raises(UsageError, match="missing.toml"):
        load_catalog(p)


def test_bad_toml_names_the_file(tmp_path):
    p = _write(tmp_path, 'name = "t"\n[[rule]\ncategory = ', "broken.toml")
    with pytest.raises(UsageError, match=r"broken\.toml: not valid TOML"):
        load_catalog(p)


def test_unknown_rule_key_names_file_rule_and_key(tmp_path):
    p = _write(tmp_path, MINIMAL + "[[rule]]\ncategory = 'x'\npatern = 'y'\n", "typo.toml")
    with pytest.raises(UsageError, match=r"typo\.toml: \[\[rule\]\] #4.*unknown key\(s\) \['patern'\]"):
        load_catalog(p)


def test_unknown_top_level_key(tmp_path):
    p = _write(tmp_path, "colour = 'red'\n" + MINIMAL)
    with pytest.raises(UsageError, match=r"cat\.toml: top level: unknown key\(s\) \['colour'\]"):
        load_catalog(p)


def test_bad_regex_names_file_and_rule(tmp_path):
    p = _write(tmp_path, MINIMAL + "[[rule]]\ncategory = 'x'\npattern = '(unclosed'\n", "regex.toml")
    with pytest.raises(UsageError, match=r"regex\.toml: \[\[rule\]\] #4 \(category 'x'\): pattern: bad regex"):
        load_catalog(p)


def test_bad_signature_regex(tmp_path):
    p = _write(tmp_path, "signature = '[a-'\n" + MINIMAL)
    with pytest.raises(UsageError, match=r"cat\.toml: signature: bad regex"):
        load_catalog(p)


def test_rule_without_matcher(tmp_path):
    p = _write(tmp_path, MINIMAL + "[[rule]]\ncategory = 'x'\n")
    with pytest.raises(UsageError, match=r"#4 .*needs at least one of"):
        load_catalog(p)


def test_owner_must_be_a_declared_optimization(tmp_path):
    p = _write(tmp_path, MINIMAL + "[[rule]]\ncategory = 'x'\npattern = 'x'\nowner = 'ghost'\n")
    with pytest.raises(UsageError, match=r"#4 .*owner 'ghost' is not a declared optimization"):
        load_catalog(p)


def test_optimization_categories_must_exist(tmp_path):
    p = _write(tmp_path, MINIMAL + "[optimizations.o]\ncategories = ['nosuch']\n")
    with pytest.raises(UsageError, match=r"\[optimizations\.o\]: categories \['nosuch'\]"):
        load_catalog(p)


def test_unknown_optimization_key(tmp_path):
    p = _write(tmp_path, MINIMAL + "[optimizations.o]\ncategories = []\nexpects = 1\n")
    with pytest.raises(UsageError, match=r"\[optimizations\.o\]: unknown key\(s\) \['expects'\]"):
        load_catalog(p)


def test_wrong_types(tmp_path):
    p = _write(tmp_path, "name = 't'\n[[rule]]\ncategory = 'x'\ncats = 'kernel'\n")
    with pytest.raises(UsageError, match="'cats' must be a non-empty list"):
        load_catalog(p)
    p = _write(tmp_path, "name = 3\n")
    with pytest.raises(UsageError, match="'name' is required"):
        load_catalog(p)


# ----------------------------------------------------------------------------------- public traces


def _kernel_times(path: Path) -> Counter[tuple[str, str]]:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    times: Counter[tuple[str, str]] = Counter()
    for e in events:
        if e.get("cat") in GPU_CATS:
            times[(e["name"], e["cat"])] += float(e.get("dur", 0))
    return times


@pytest.fixture(scope="module")
def public_kernel_times() -> Counter[tuple[str, str]]:
    total: Counter[tuple[str, str]] = Counter()
    for p in public_steps():  # the six TraceLens serving steps
        total.update(_kernel_times(p))
    return total


def print_top_kernels(times: Counter[tuple[str, str]], catalog: Catalog, n: int = 20) -> None:
    """Print the top-n GPU ops by total time with their category (visible with ``pytest -s``)."""
    print(f"\ntop {n} GPU ops by time under catalog {catalog.name!r}")
    print(f"{'total_us':>10}  {'category':<12} {'owner':<12} name")
    for (name, cat), us in times.most_common(n):
        category, owner = catalog.classify(name, cat)
        print(f"{us:10.1f}  {category:<12} {owner or '-':<12} {name[:100]}")


@needs_public
@pytest.mark.parametrize("name", catalog_names())
def test_every_public_trace_op_classifies_with_every_catalog(public_kernel_times, name):
    c = load_catalog(name)
    frame = pl.DataFrame(
        {"name": [k[0] for k in public_kernel_times], "cat": [k[1] for k in public_kernel_times]}
    )
    out = c.classify_frame(frame)
    assert out["category"].null_count() == 0
    assert set(out["category"].unique()) <= set(c.categories)


@needs_public
def test_top_kernels_of_public_traces_get_sensible_generic_categories(public_kernel_times):
    g = load_catalog("generic")
    print_top_kernels(public_kernel_times, g)
    top = {name: g.classify(name, cat)[0] for (name, cat), _ in public_kernel_times.most_common(40)}
    by_prefix = {
        "Cijk_Alik_Bljk": "gemm",  # hipBLASLt / Tensile
        "_matmul_ogs_": "moe",  # triton_kernels MoE matmul (gpt-oss)
        "bmm_MxE4m3": "moe",  # trtllm-gen MoE batched GEMM
        "_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefill": "attention",
        "_ZN5aiter24add_rmsnorm_quant": "norm",
        "_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwd": "norm",
        "kernel_unified_attention": "attention",
        "void rotary_embedding_kernel": "rope",
        "void vllm::rotary_embedding_kernel": "rope",
        "void (anonymous namespace)::multimem_all_reduce_kernel": "comm",
        "void paged_attention_ll4mi_QKV": "attention",
        "nvjet_tst_": "gemm",
        "fmhaSm100aKernel_": "attention",
        "void moe::dev::": "moe",
        "Memcpy DtoD": "memcpy",
        "triton_poi_fused__to_copy": "elementwise",
        "void at::native::elementwise_kernel_manual_unroll<128, 8, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda": "memcpy",
        "_ZN7sgl_hip10activation18act_and_mul_kernel": "elementwise",
    }
    checked = 0
    for name, category in top.items():
        for prefix, want in by_prefix.items():
            if name.startswith(prefix):
                assert category == want, (name, category, want)
                checked += 1
    assert checked >= 25
    # the generic catalog explains nearly all GPU time of these traces
    total = sum(public_kernel_times.values())
    other = sum(us for (n, c), us in public_kernel_times.items() if g.classify(n, c)[0] == "other")
    assert other / total < 0.01


@needs_public
def test_auto_catalog_picks_generic_for_the_public_traces(public_kernel_times):
    assert auto_catalog(name for name, _ in public_kernel_times).name == "generic"


def test_catalog_pickles_for_worker_processes():
    import pickle

    c = load_catalog("sglang-glm52")
    c2 = pickle.loads(pickle.dumps(c))
    assert c2 == c
    assert c2.classify("void sglang::topk_main_kernel<true, 0>(...)") == ("topk", "topk_v2")


def test_installed_layout_finds_the_packaged_copy(tmp_path):
    """A wheel has no top-level kernels/; pyproject force-includes it as profkit/_kernels."""
    import shutil
    import subprocess
    import sys

    pkg = tmp_path / "site" / "profkit"
    pkg.mkdir(parents=True)
    (pkg / "analysis").mkdir()
    for f in ("__init__.py", "errors.py", "terms.py", "analysis/__init__.py", "analysis/catalog.py"):
        shutil.copy(REPO / "profkit" / f, pkg / f)
    shutil.copytree(REPO / "kernels", pkg / "_kernels")
    code = (
        "from profkit.analysis.catalog import catalog_dir, catalog_names, load_catalog\n"
        "print(catalog_dir()); print(catalog_names()); print(load_catalog('generic').name)"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    out = run.stdout.split("\n")
    assert out[0] == str(pkg / "_kernels")
    assert out[1] == str(catalog_names())
    assert out[2] == "generic"


# --- choosing the catalog: one place for every command (issue 15) --------------------------------

def test_choose_catalog_option_then_manifest_then_kernel_names(tmp_path):
    from profkit.analysis.catalog import CatalogChoice, choose_catalog

    data = REPO / "tests" / "data"
    # --catalog wins, even where a manifest implies another
    c = choose_catalog("generic", [data / "gpu_loo" / "all"])
    assert (c.how, c.name, c.note()) == ("option", "generic", None)
    # a run folder's manifest.json, and a trace's <stem>.manifest.json: the target's catalog, said so
    for where in (data / "gpu_loo" / "all", data / "gpu_proxy" / "baseline.trace.json.gz"):
        c = choose_catalog(None, [where])
        assert (c.how, c.name) == ("manifest", "proxy") and "run manifest" in (c.note() or "")
    # an SGLang manifest implies the GLM catalog only for a GLM model
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"target": "sglang", "preset": "glm52-nvfp4-tp8"}))
    assert choose_catalog(None, [run]).name == "sglang-glm52"
    (run / "manifest.json").write_text(json.dumps({"target": "sglang", "model_path": "Qwen/Qwen3-8B"}))
    # no manifest that implies one: each rank picks by its kernel names
    assert choose_catalog(None, [run]) == CatalogChoice() and CatalogChoice().identity is None
    assert choose_catalog(None, [data / "gpu" / "eager_sync.pt.trace.json.gz"]).how == "kernel names"


def test_a_catalog_has_one_identity_in_every_cache():
    """The per-option analysis cache and the stored summary key a catalog by the same identity,
    and an edited catalog (another rule) is another identity."""
    from dataclasses import replace

    from profkit.analysis.catalog import CatalogChoice, catalog_identity
    from profkit.analysis.parallel import _options  # the options the per-option cache's key covers (ingest/cache.analysis_key)

    cat = load_catalog("proxy")
    choice = CatalogChoice(cat, "option")
    assert choice.identity == _options(None, 2.0, cat)["catalog"]
    assert catalog_identity(load_catalog(str(catalog_dir() / "proxy.toml"))) == choice.identity  # by name or by its path: one catalog
    edited = replace(cat, rules=cat.rules[1:])
    assert catalog_identity(edited) != choice.identity


def test_the_effect_catalog_is_the_choice_else_the_candidates_own():
    from profkit.analysis.catalog import CatalogChoice

    summary = {"ranks": [{"rank": 0, "catalog": "proxy"}, {"rank": 1, "catalog": "no-such-catalog"}]}
    assert CatalogChoice(load_catalog("generic"), "option").for_effect(summary, 0).name == "generic"
    assert CatalogChoice().for_effect(summary, 0).name == "proxy"
    assert CatalogChoice().for_effect(summary, 1) is None  # recorded but not loadable: no expected-effect check
    assert CatalogChoice().for_effect(summary, 2) is None


@pytest.mark.parametrize("catalog, name, category", [
    # real SGLang 0.5.23 on a CPU: 97% of an iteration in aten::linear -> sgl_kernel::weight_packed_linear (issue 27)
    ("generic", "aten::linear", "gemm"), ("generic", "sgl_kernel::weight_packed_linear", "gemm"), ("generic", "aten::addmm", "gemm"),
    ("generic", "sgl_kernel::rmsnorm_cpu", "norm"), ("generic", "sgl_kernel::decode_attention_cpu", "attention"),
    ("proxy", "aten::linear", "gemm"), ("proxy", "aten::to", "elementwise"),
    # real vLLM 0.32 on a CPU (tests/data/vllm_cpu)
    ("vllm", "_C::weight_packed_linear", "gemm"), ("vllm", "_C::onednn_mm", "gemm"),
    ("vllm", "vllm::unified_attention_with_output", "attention"), ("vllm", "vllm::unified_kv_cache_update", "attention"),
    ("vllm", "_C::rejection_greedy_sample_kernel_impl", "sampling"), ("vllm", "_C::greedy_argmax", "sampling"),
    ("vllm", "compiled code (Inductor, inside a compiled graph)", "compiled"), ("vllm", "aten::item", "other"),
    # vLLM on a GPU keeps the generic rules
    ("vllm", "nvjet_tst_128x64_64x4_1x2_h_bz_coopA_NNT", "gemm"), ("vllm", "Memcpy HtoD (Pinned -> Device)", "memcpy"),
])
def test_cpu_op_names(catalog, name, category):
    assert load_catalog(catalog).classify(name, "kernel", None)[0] == category


def test_vllm_catalog_is_picked_for_a_vllm_trace():
    assert auto_catalog(["_C::weight_packed_linear", "aten::to", "vllm::unified_attention_with_output"]).name == "vllm"
    assert auto_catalog(["aten::linear", "sgl_kernel::weight_packed_linear"]).name == "generic"
