"""Issue 17: the headline numbers of README.md and bench/README.md are read from the committed
result files under bench/results/ and must appear in the text as written (rounded as there).
A re-run that changes a result file without the READMEs, or an edit of a number without a
result behind it, fails here. README.md's measurements are its "How fast" table (issue 31);
the paragraphs it carried before, with their numbers, are in bench/README.md's "From the
README (until 2026-11-28)", verbatim."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
README = (ROOT / "README.md").read_text()
BENCH_README = (ROOT / "bench" / "README.md").read_text()
#: the issue's three shapes (K, N), in the order the READMEs list them
SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))


def _load(rel: str) -> dict:
    return json.loads((RESULTS / rel).read_text())


def _slash(values, digits: int) -> str:
    return "/".join(f"{v:.{digits}f}" for v in values)


def _m2048(doc: dict, key: str) -> list[float]:
    by_shape = {(t["K"], t["N"]): t for t in doc["times"] if t["M"] == 2048}
    return [by_shape[s][key] for s in SHAPES]


def test_decode_times_at_m1() -> None:
    """The README's old status (in bench/README): fp4 at M = 1 (best tuned weight-stream kernel,
    Nsight Compute) and MLX 4-bit."""
    rows = _load("issue15_h100_2026-11-25c/decode/decode_sweep.json")["rows"]

    def best(subject: str, shape: tuple[int, int]) -> float:
        return min(r["time_ns"] for r in rows if r["M"] == 1 and r["subject"] == subject
                   and (r["K"], r["N"]) == shape) / 1e3

    assert f"fp4 at M = 1 takes {_slash([best('fp4', s) for s in SHAPES], 1)} us" in BENCH_README.replace("\n", " ")
    assert f"MLX 4-bit {_slash([best('mlx_q4', s) for s in SHAPES], 1)}" in BENCH_README.replace("\n", " ")


def test_warpgroup_times_at_m2048() -> None:
    """The README's old status (in bench/README): the tuned dense warpgroup kernel (256x128, 4
    stages, depth 2) at M = 2048."""
    doc = _load("issue15_h100_2026-11-25c/warpgroup_results.json")
    ours = _m2048(doc, "wgs256x128s4d2_us")
    fp16 = _m2048(doc, "fp16_us")
    mlx4 = _m2048(doc, "mlx4_us")
    text = BENCH_README.replace("\n", " ")
    assert f"the warpgroup kernels take {_slash(ours, 0)} us" in text
    ratio = [f / o for f, o in zip(fp16, ours)]
    assert f"{min(ratio):.2f}-{max(ratio):.2f}x fp16" in text
    speedup = [m / o for m, o in zip(mlx4, ours)]
    assert f"{min(speedup):.1f}-{max(speedup):.1f}x faster than MLX 4-bit" in text
    assert all(c["ok"] for c in doc["checks"])


def test_sparse_wgmma_times_at_m2048() -> None:
    """The README's old status and bench/README "Issue 15, third round": fp4 2:4 on the sparse
    wgmma with steps in pairs, the 192x128 s3 d2 schedule (the tuned one), in run 5 and again in
    run 6."""
    doc = _load("issue15_h100_2026-11-25d/sparse_wgmma/run5_pairs.json")
    ours = _m2048(doc, "wgs192x128s3d2_us")
    fp16 = _m2048(doc, "fp16_us")
    text = BENCH_README.replace("\n", " ")
    ratio = [f / o for f, o in zip(fp16, ours)]
    assert f"{_slash(ours, 1)} us ({min(ratio):.2f}-{max(ratio):.2f}x fp16 in that run" in text
    assert all(c["ok"] for c in doc["checks"])
    again = _load("issue15_h100_2026-11-25d/sparse_wgmma/run6_tuned.json")
    ratio = [f / o for f, o in zip(_m2048(again, "fp16_us"), _m2048(again, "wgs192x128s3d2_us"))]
    assert f"{min(ratio):.2f}-{max(ratio):.2f}x in a second" in text
    assert all(c["ok"] for c in again["checks"])
    bench = " ".join(BENCH_README.split())
    for (k, n), t, f in zip(SHAPES, ours, fp16):
        assert f"| {k} x {n} | 2048 | {f:.1f} |" in bench and f"**{t:.1f}**" in bench


def test_model_prefill_and_decode() -> None:
    """bench/README: the 32-layer Llama-3-8B-shaped model, prefill and decode times."""
    rows = {r["variant"]: r for r in _load("issue15_h100_2026-11-25d/model_bench_run4_kernels.json")["rows"]}
    text = " ".join(BENCH_README.split())

    def pf(v: str) -> str:
        return f"{rows[v]['prefill_512_ms']:.1f} / {rows[v]['prefill_2048_ms']:.1f}"

    assert f"fp4 2:4 {pf('fp4_2of4')} ms" in text
    assert f"(fp4 {pf('fp4')}, mlx-lm 4-bit {pf('mlx_4bit_g64')}, fp16 {pf('fp16')})" in text
    assert f"decode {rows['fp4_2of4']['decode_ms_per_token']:.2f} ms/token" in text


def test_readme_model_speedups() -> None:
    """The README's old model line (in bench/README): fp4 against mlx-lm's 4-bit layers, from
    the run in issue15_h100_2026-11-27c (run 8: prefill 512 / 2048 tokens, decode)."""
    rows = {r["variant"]: r for r in _load("issue15_h100_2026-11-27c/run8_model_bench_parts.json")["rows"]}
    fp4, mlx4 = rows["fp4"], rows["mlx_4bit_g64"]
    pre = [mlx4[f"prefill_{t}_ms"] / fp4[f"prefill_{t}_ms"] for t in (512, 2048)]
    dec = mlx4["decode_ms_per_token"] / fp4["decode_ms_per_token"]
    text = BENCH_README.replace("\n", " ")
    assert f"fp4 prefills 512/2048 tokens {pre[0]:.2f}x/{pre[1]:.2f}x faster" in text
    assert f"decodes at {dec:.2f}x" in text


def test_first_generation_bench_range() -> None:
    """bench/README: the range of the correctness pipelines' first GPU benchmark."""
    rows = [r for r in _load("gpu/bench_h100_2026-11-22/bench.json")["rows"]
            if r["kind"] == "marlin" and r.get("kernel_us") is not None]
    us = [r["kernel_us"] for r in rows]
    vs = [r["vs_qmm"] for r in rows if r.get("vs_qmm") is not None]
    want = f"{min(us):,.0f}-{max(us):,.0f} us, {min(vs):.2f}-{max(vs):.2f}x MLX"
    assert want in " ".join(BENCH_README.split())


@pytest.mark.parametrize("claim", ["2,268 GPU checks", "1.3-6x faster than MLX at M = 1-16",
                                   "59-4,000 us", "0.25-0.67x"])
def test_stale_claims_are_gone(claim: str) -> None:
    """Claims issue 17 found wrong against their result files: in none of the texts that carry
    measurements, which are README.md, bench/README.md (holding the README's old paragraphs,
    where such claims lived) and the guides under docs/."""
    assert "Status: the format DSL" in BENCH_README and "Speed, honestly:" in BENCH_README
    texts = {"README.md": README, "bench/README.md": BENCH_README,
             **{f"docs/{p.name}": p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}}
    assert len(texts) > 5
    for name, text in texts.items():
        assert claim not in " ".join(text.split()), name


def test_warp_roles_and_read_floor(capsys: pytest.CaptureFixture) -> None:
    """bench/README, issue 15's fifth round: the warp-role and unspecialised kernels at M = 2048
    in runs 3-5 (every check of each run correct), and the read floor table as the probe's
    report prints it from the committed Nsight Compute output."""
    import importlib.util

    text = BENCH_README
    for run in ("run3_consumer_copies", "run4_slack_depth", "run5_final"):
        doc = _load(f"issue15_h100_2026-11-27/{run}.json")
        for key in ("ws256c44_us", "wg256_us"):
            assert " | ".join(f"{v:.1f}" for v in _m2048(doc, key)) + " |" in text, (run, key)
        assert doc["checks"] and all(c["ok"] for c in doc["checks"]), run
    spec = importlib.util.spec_from_file_location("read_floor_probe", ROOT / "bench" / "probes" / "read_floor_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)  # type: ignore[union-attr]
    probe.report(RESULTS / "issue15_h100_2026-11-27" / "read_floor_ncu.txt")
    for line in capsys.readouterr().out.splitlines():
        assert line in text, line


def test_host_path_round() -> None:
    """bench/README, issue 15's seventh round: the decode step's parts before and after, the
    rounds, the model bench and the fused-parts checks, from their result files."""
    text = " ".join(BENCH_README.split())
    run = "issue15_h100_2026-11-27c"

    def steps(name: str) -> dict:
        return {r["variant"]: r for r in _load(f"{run}/{name}")["rows"]}

    before, after = steps("run5_decode_host_probe_rounds_partfix.json"), steps("run7_decode_host_probe_parts.json")
    b, a = before["fp4"], after["fp4"]
    assert f"fp4 build {b['build']:.2f}, encode {b['encode']:.2f}, wait {b['wait']:.2f} ({b['graph_nodes']} primitives" in text
    assert f"fp4 build {a['build']:.2f}, encode {a['encode']:.2f}, wait {a['wait']:.2f} ms ({a['graph_nodes']}" in text
    assert f"{b['build'] + b['encode']:.2f} -> {a['build'] + a['encode']:.2f} ms for fp4" in text
    rounds = _load(f"{run}/run7_decode_host_probe_parts.json")["rounds"]
    fp4 = [r["mean_ms"] for r in rounds if r["variant"] == "fp4"]
    assert ", ".join(f"{v:.2f}" for v in fp4) in text
    model = {r["variant"]: r for r in _load(f"{run}/run8_model_bench_parts.json")["rows"]}
    ratio = model["mlx_4bit_g64"]["decode_ms_per_token"] / model["fp4"]["decode_ms_per_token"]
    assert f"decode fp4 {model['fp4']['decode_ms_per_token']:.2f} ms/token" in text and f"{ratio:.2f}x;" in text
    bf16 = {r["variant"]: r for r in _load(f"{run}/run9_model_bench_bf16_parts.json")["rows"]}
    assert bf16["fp4"]["decode_ms_per_token"] < bf16["mlx_4bit_g64"]["decode_ms_per_token"]
    ratio = bf16["mlx_4bit_g64"]["decode_ms_per_token"] / bf16["fp4"]["decode_ms_per_token"]
    assert f"fp4 {bf16['fp4']['decode_ms_per_token']:.2f} ms/token" in text and f"{ratio:.2f}x (the sixth" in text
    assert f"in bf16 it now decodes at {ratio:.2f}x" in text
    checks = _load(f"{run}/fused_parts_gpu.json")
    assert checks["poisoned"] and all(r["ok"] and r["bit_identical_to_split"] for r in checks["rows"])
    assert f"{len(checks['rows'])}/{len(checks['rows'])}. fp4, int4" in text


def test_bf16_round() -> None:
    """bench/README, issue 15's sixth round: bf16 and f16 warpgroup kernels before and after
    (one process per run, every check correct), the bf16 layer and the bf16 model."""
    text = " ".join(BENCH_README.split())
    run = "issue15_h100_2026-11-27b"
    doc = _load(f"{run}/run3_repeat.json")
    assert all(c["ok"] for c in doc["checks"])
    new, old = _m2048(doc, "bf16_wgs256x128s4d2_us"), _m2048(doc, "bf16_wgs256old_us")
    assert f"fp4 bf16 (`run3_repeat.*`): {_slash(new, 1)} (before: {_slash(old, 1)}, " in text
    gain = [o / n for o, n in zip(old, new)]
    assert f"{min(gain):.2f}-{max(gain):.2f}x faster; bf16 `mx.matmul` {_slash(_m2048(doc, 'bf16_matmul_us'), 1)})" in text
    assert f"fp4 f16 predicated in run 3: {_slash(_m2048(doc, 'wgs256old_us'), 1)} (fp16 {_slash(_m2048(doc, 'fp16_us'), 1)})" in text
    int4 = _load(f"{run}/run5_int4.json")
    new, old = _m2048(int4, "bf16_wgs256x128s4d2_us"), _m2048(int4, "bf16_wgs256old_us")
    gain = [o / n for o, n in zip(old, new)]
    assert f"int4 bf16 (`run5_int4.*`): {_slash(new, 1)} (before {_slash(old, 1)}, {min(gain):.2f}-{max(gain):.2f}x" in text
    zp = _load(f"{run}/run5_uint4_zp.json")
    assert (f"with the branch {_slash(_m2048(zp, 'wgs256branch_us'), 1)} against "
            f"{_slash(_m2048(zp, 'wgs256x128s4d2_us'), 1)} and {_slash(_m2048(zp, 'wgs256old_us'), 1)} serialised") in text
    sparse = _load(f"{run}/run3_sparse.json")
    assert all(c["ok"] for c in sparse["checks"])
    assert (f"fp4 2:4 bf16 (`run3_sparse.*`, 192 x 128 tiles) {_slash(_m2048(sparse, 'bf16_wgs192x128s3_us'), 1)} "
            f"(before {_slash(_m2048(sparse, 'bf16_wgs192old_us'), 1)}") in text
    final = _load(f"{run}/run6_final_text_correctness.json")["checks"]
    assert all(c["ok"] for c in final) and f"{len(final)}/{len(final)} warpgroup checks" in text
    layer = _load(f"{run}/layer_bench_bf16.json")["rows"]

    def per_call(kind: str, m: int) -> list[float]:
        by = {(r["k"], r["n"]): r for r in layer if r["kind"] == kind and r["m"] == m}
        return [by[s]["batched_per_call_us"] for s in SHAPES]

    assert f"fp4 per call at M = 2048: {_slash(per_call('fp4', 2048), 1)} us" in text
    assert f"(MLX 4-bit `QuantizedLinear` {_slash(per_call('mlx_4bit_g64', 2048), 1)}," in text
    model = {r["variant"]: r for r in _load(f"{run}/model_bench_bf16.json")["rows"]}
    fp4, q4 = model["fp4"], model["mlx_4bit_g64"]
    assert f"fp4 {fp4['prefill_512_ms']:.1f} / {fp4['prefill_2048_ms']:.1f} ms" in text
    assert (f"{q4['prefill_512_ms'] / fp4['prefill_512_ms']:.2f}x / "
            f"{q4['prefill_2048_ms'] / fp4['prefill_2048_ms']:.2f}x faster") in text
    assert f"decode {fp4['decode_ms_per_token']:.2f} ms/token" in text
    f16 = {r["variant"]: r for r in _load(f"{run}/model_bench_f16.json")["rows"]}
    assert (f"prefill 512 / 2048 tokens fp4 {f16['fp4']['prefill_512_ms']:.1f} / {f16['fp4']['prefill_2048_ms']:.1f} ms, "
            f"fp4 2:4 {f16['fp4_2of4']['prefill_512_ms']:.1f} / {f16['fp4_2of4']['prefill_2048_ms']:.1f}") in text
    ratio = [f16["mlx_4bit_g64"][k] / f16["fp4"][k] for k in ("prefill_512_ms", "prefill_2048_ms")]
    assert f"fp4 {ratio[0]:.2f}x / {ratio[1]:.2f}x faster than mlx-lm 4-bit" in text


def test_activation_sparse_gemm_round() -> None:
    """bench/README, issue 15's eighth round and the README's old "Speed, honestly": the sparse
    FFN step before and after, the mma.sp ceiling and the final GPU checks, from their result
    files."""
    text = " ".join(BENCH_README.split())
    run = "issue15_h100_2026-11-27d"
    final = _load(f"{run}/run13_h100_final_ffn.json")
    assert "H100" in final["device"]
    ms = {r["what"]: r["ms"] for r in final["rows"]}
    dense, split, dense_dw2 = ms["dense_fwd_bwd"], ms["top2_split_fwd_bwd"], ms["top2_densedw2_fwd_bwd"]
    assert f"| {dense:.2f} | **{split:.2f}** | **{dense_dw2:.2f}** | **{dense / split:.2f}x** ({dense / dense_dw2:.2f}x) |" in text
    assert f"takes {split:.1f} ms with the split dW2 and {dense_dw2:.1f} ms with `dw2=\"dense\"`" in text
    assert f"against {dense:.1f} ms for the dense layer" in text
    rows = _load(f"{run}/run8_h100_mma_rate.json")["rows"]

    def rate(name: str) -> int:  # the mean over 4, 8 and 16 warps a block, to 10 TFLOP/s
        got = [r["dense_equivalent_tflops"] for r in rows if r["instruction"] == name]
        return 10 * round(sum(got) / len(got) / 10)
    assert f"peaks at {rate('mma.sp m16n8k32')} dense-equivalent TFLOP/s" in text
    assert f"`mma.sync` dense {rate('mma.sync m16n8k16')}" in text
    checks = _load(f"{run}/run13_h100_final_check.json")["rows"]
    assert all(r["ok"] for r in checks) and f"{len(checks)}/{len(checks)} (`check`, final code" in text
    assert "0 errors" in (RESULTS / run / "run13_h100_final_memcheck.log").read_text()


#: README.md's "How fast" table and bench/README.md's current table: the whole-model run
HOW_FAST = "model_h200_2026-11-28b/model_bench.json"
#: the table's columns, as result variants
HOW_FAST_COLUMNS = {"fp16": "fp16", "mlx-lm 4-bit (g64)": "mlx_4bit_g64", "marlin-dsl fp4 (g128)": "fp4"}
#: the table's rows: label -> (result key, a cell as printed)
HOW_FAST_ROWS = {
    "weights": ("weight_gb", "{:.1f} GB"),
    "decode, 1 stream": ("decode_tokens_per_s", "{:.0f} tokens/s"),
    "decode, 16 streams (continuous batching)": ("batch_16_tokens_per_s", "{:.0f} tokens/s"),
    "decode, 32 streams (continuous batching)": ("batch_32_tokens_per_s", "{:.0f} tokens/s"),
    "prefill, 512 tokens": ("prefill_512_ms", "{:.1f} ms"),
    "prefill, 2048 tokens": ("prefill_2048_ms", "{:.1f} ms"),
}
#: where each README has the table
HOW_FAST_SECTIONS = {"README.md": (README, "## How fast"),
                     "bench/README.md": (BENCH_README, "## The current numbers: a whole model")}


def _section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _table(section: str) -> list[list[str]]:
    """The section's first Markdown table, as rows of stripped cells (the rule line dropped)."""
    lines = section.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip()[1:-1].split("|")])
    assert set("".join(rows[1])) <= set("-: "), rows[1]
    return [rows[0], *rows[2:]]


@pytest.mark.parametrize("name", list(HOW_FAST_SECTIONS))
def test_how_fast_table_is_the_model_run(name: str) -> None:
    """Every number of README.md's "How fast" table (weights, tokens/s at 1, 16 and 32 streams,
    prefill ms at 512 and 2048 tokens; fp16, mlx-lm 4-bit g64, fp4) is the result file's value
    rounded as printed, the fastest of each speed row (and only it) in bold; bench/README.md's
    current table is the same table. Each says which run it is."""
    doc = _load(HOW_FAST)
    rows = {r["variant"]: r for r in doc["rows"]}
    text, heading = HOW_FAST_SECTIONS[name]
    section = _section(text, heading)
    header, *body = _table(section)
    assert header == ["", *HOW_FAST_COLUMNS], (name, header)
    assert [row[0] for row in body] == list(HOW_FAST_ROWS), name
    for label, *cells in body:
        key, cell = HOW_FAST_ROWS[label]
        values = [rows[variant][key] for variant in HOW_FAST_COLUMNS.values()]
        assert [c.strip("*") for c in cells] == [cell.format(v) for v in values], (name, label)
        if key != "weight_gb":
            best = values.index(max(values) if key.endswith("tokens_per_s") else min(values))
            assert [c.startswith("**") and c.endswith("**") for c in cells] == [i == best for i in range(3)], (name, label)
    flat = " ".join(section.split())
    assert doc["device"]["device_name"] == "NVIDIA H200" and "NVIDIA H200" in flat, name
    assert f"medians of {doc['repeats']} rounds" in flat and HOW_FAST.split("/")[0] in flat, name
    assert doc["layers"] == 32 and "32 layers" in flat and doc["dtype"] == "float16" and "float16" in flat, name
    if name == "bench/README.md":
        assert f"{doc['date']}, commit {doc['commit']}, MLX {doc['mlx']}" in flat
        assert f"{doc['decode_tokens']} decode tokens after a 32-token prompt" in flat
        assert f"32-token prompts, {doc['batch_tokens']} tokens per stream" in flat
    assert _table(_section(README, "## How fast")) == _table(_section(BENCH_README, "## The current numbers: a whole model"))


def test_current_model_run_spread_and_graph_build() -> None:
    """bench/README's notes under the current table: the spread of single rounds and the graph
    build time per decode token, from the same result file; the day's other two runs; the
    README's batched-decode ratios."""
    rows = {r["variant"]: r for r in _load(HOW_FAST)["rows"]}
    flat = " ".join(_section(BENCH_README, "## The current numbers: a whole model").split())

    def spread(variant: str, key: str, digits: int) -> str:
        got = [v["tokens_per_s"] if isinstance(v, dict) else v for v in rows[variant][key]]
        return f"{min(got):.{digits}f}-{max(got):.{digits}f}"

    assert (f"prefill 512 tokens: fp16 {spread('fp16', 'prefill_512_ms_all', 1)} ms, "
            f"fp4 {spread('fp4', 'prefill_512_ms_all', 1)} ms") in flat
    assert (f"at 32 streams: fp16 {spread('fp16', 'batch_32_all', 0)} tokens/s, "
            f"fp4 {spread('fp4', 'batch_32_all', 0)} tokens/s") in flat
    decode = [t for r in rows.values() for t in r["decode_ms_all"]]
    assert f"decode at 1 stream: {min(decode):.2f}-{max(decode):.2f} ms per token over all three" in flat
    assert (f"build {rows['fp4']['graph_build_ms_per_token']:.2f} ms per token for fp4 against "
            f"{rows['mlx_4bit_g64']['graph_build_ms_per_token']:.2f} for mlx-lm 4-bit") in flat
    for run, words in (("model_h200_2026-11-28/model_bench.json", "had fp4 decoding one stream at"),
                       ("model_h200_2026-11-28b/model_bench_3rounds.json", "rounds")):
        other = {r["variant"]: r["decode_tokens_per_s"] for r in _load(run)["rows"]}
        assert (f"{words} {other['fp4']:.0f} tokens/s against {other['mlx_4bit_g64']:.0f} for mlx-lm 4-bit and "
                f"{other['fp16']:.0f} for fp16" in flat) or (
                f"{words} (`results/{run}`) {other['fp4']:.0f} against {other['mlx_4bit_g64']:.0f} and "
                f"{other['fp16']:.0f}" in flat), run
    vs_fp16 = [rows["fp4"][k] / rows["fp16"][k] for k in ("batch_16_tokens_per_s", "batch_32_tokens_per_s")]
    vs_mlx4 = [rows["fp4"][k] / rows["mlx_4bit_g64"][k] for k in ("batch_16_tokens_per_s", "batch_32_tokens_per_s")]
    assert (f"{min(vs_fp16):.2f}-{max(vs_fp16):.2f}x fp16 and {min(vs_mlx4):.1f}-{max(vs_mlx4):.1f}x mlx-lm's 4-bit"
            in " ".join(README.split()))


def test_user_path_on_the_gpu() -> None:
    """bench/README: the README's quick start on the H200 (bench/user_path_gpu.py) and the GPU
    tests, from their result files."""
    doc = _load("user_path_h200_2026-11-28/user_path_gpu.json")
    assert doc["passed"] and doc["device"]["device_name"] == "NVIDIA H200"
    variants = doc["variants"].values()
    assert all(v["commands_ok"] and v["same_text"] for v in variants)
    flat = " ".join(BENCH_README.split())
    assert (f"within {max(v['prefill_64'] for v in variants):.1e} (prefill) and "
            f"{max(v['decode_max'] for v in variants):.1e} (decode)") in flat
    log = (RESULTS / "user_path_h200_2026-11-28" / "gpu_tests.log").read_text()
    passed = int(log.split(" passed")[0].split()[-1])
    assert "failed" not in log and f"pass, {passed} of {passed}" in flat


def _sweep_times(rel: str) -> dict[tuple[str, int, int, int], float]:
    """A decode sweep's times by (kernel or subject, M, K, N), in us (its labels file names the
    kernel of each row)."""
    rows = _load(f"{rel}/decode_sweep.json")["rows"]
    labels = _load(f"{rel}/decode_sweep_labels.json")
    assert len(rows) == len(labels)
    return {(lab.get("kernel", lab["subject"]), lab["M"], lab["K"], lab["N"]): row["time_ns"] / 1e3
            for lab, row in zip(labels, rows)}


def _sweep_name(fmt_name: str, m: int, k: int, n: int) -> str:
    """decode_sweep's kernel name of today's tuned schedule (bench/probes/decode_sweep_kernels.py)."""
    sys.path.insert(0, str(ROOT / "bench" / "probes"))
    from decode_sweep_kernels import tuned_kernel_name

    return tuned_kernel_name(fmt_name, m, k, n)


def _tuned_in(run: str, subject: str) -> dict:
    """{(M, K, N): kernel} the sweep of `run` (a results folder) timed as `subject`'s tuned
    kernel then (today's table may have moved on)."""
    return {(lab["M"], lab["K"], lab["N"]): lab["kernel"] for lab in _load(f"{run}/decode_sweep_labels.json")
            if lab.get("tuned") and lab["subject"] == subject}


def test_sparse_decode_round() -> None:
    """Issue 33: the 2:4 decode before (run 1's tuned kernels) and after (run 3's tuned ones:
    `tuned_schedule` picks them today at M = 1; at M = 16 run 18 of the next round replaced
    them) against dense fp4 in run 3, in bench/README.md and the results README."""
    base = "issue33_h200_2026-11-28"
    before, now = _sweep_times(f"{base}/run1_schedules"), _sweep_times(f"{base}/run3_tuned")

    old_tuned, run3_tuned = _tuned_in(f"{base}/run1_schedules", "fp4_2of4"), _tuned_in(f"{base}/run3_tuned", "fp4_2of4")
    dense_tuned = _tuned_in(f"{base}/run3_tuned", "fp4")
    for k, n in SHAPES:
        assert run3_tuned[(1, k, n)] == _sweep_name("fp4_2of4", 1, k, n)
    text = " ".join(BENCH_README.split())
    results = " ".join((RESULTS / base / "README.md").read_text().split())
    for m, now_phrase, was_phrase in ((1, "at M = 1 {}", "(was {})"), (16, "at M = 16 {}", "(was {})")):
        # M = 16: the schedule tuned after run 3's dry run (8-row M tiles, two N tiles a warp,
        # 8 K warps, depth 2, x_ahead), until run 18 of the next round
        sparse_now = [now[(run3_tuned[(m, k, n)] if m == 1 else "fp4_2of4_m8_n32t2_kw8_d2_u1_v1_xa1_at16", m, k, n)]
                      for k, n in SHAPES]
        sparse_was = [before[(old_tuned[(m, k, n)], m, k, n)] for k, n in SHAPES]
        dense = [now[(dense_tuned[(m, k, n)], m, k, n)] for k, n in SHAPES]
        slash = " / ".join(f"{v:.1f}" for v in sparse_now)
        assert now_phrase.format(slash) in text, slash
        assert was_phrase.format(" / ".join(f"{v:.1f}" for v in sparse_was)) in text
        assert " / ".join(f"{v:.1f}" for v in dense) in text
        for (k, n), d, was, new in zip(SHAPES, dense, sparse_was, sparse_now):
            shape = f"{k} x {n}"
            assert (f"| {shape} | {m} | {d:.1f} | {was:.1f} | {new:.1f} | {was / new:.2f}x | {d / new:.2f} |"
                    in results), (shape, m)


def test_sparse_decode_fixed_part() -> None:
    """Issue 33: the fixed part and marginal rate of dense fp4 and fp4 2:4 at M = 1 (run 3),
    fitted on two shapes, and what 2:4 would take at dense's rate."""
    base = "issue33_h200_2026-11-28"
    now = _sweep_times(f"{base}/run3_tuned")
    text = " ".join((RESULTS / base / "README.md").read_text().split())

    def size(fmt_name: str, k: int, n: int) -> int:  # codes, 2-bit positions of kept values, f16 scales
        codes = k * n // 2 if fmt_name == "fp4" else k * n // 4 + k * n // 8
        return codes + (k // 128) * n * 2

    tuned = {f: _tuned_in(f"{base}/run3_tuned", f) for f in ("fp4", "fp4_2of4")}
    fits = {}
    for fmt_name in ("fp4", "fp4_2of4"):
        (b0, t0), (b1, t1) = [(size(fmt_name, k, n), now[(tuned[fmt_name][(1, k, n)], 1, k, n)])
                              for k, n in SHAPES[:2]]
        rate = (b1 - b0) / (t1 - t0) / 1e6  # TB/s (bytes / us / 1e6)
        fits[fmt_name] = (t0 - b0 / rate / 1e6, rate)
        assert f"{fits[fmt_name][0]:.2f} us + {rate:.2f} TB/s" in text, fmt_name
    fixed, rate = fits["fp4_2of4"][0], fits["fp4"][1]
    ideal = [fixed + size("fp4_2of4", k, n) / rate / 1e6 for k, n in SHAPES]
    dense = [now[(tuned["fp4"][(1, k, n)], 1, k, n)] for k, n in SHAPES]
    assert " / ".join(f"{v:.2f}" for v in ideal) + " us" in text
    assert " / ".join(f"{d / v:.2f}x" for d, v in zip(dense, ideal)) + " dense" in text


def test_block_skip_round() -> None:
    """Issue 33: the block-skipping table in round two's results README is bench/block_skip_gpu.py's
    table of run 7's rows, run 11's kernels (round three) are what a dry run builds today (same
    digests), and the ranges bench/README.md quotes for round two come from runs 6 and 7."""
    import importlib.util

    from marlin_dsl.targets.cuda.source import CudaSource

    spec = importlib.util.spec_from_file_location("block_skip_gpu", ROOT / "bench" / "block_skip_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    base = "issue33_h200_2026-11-28"
    run7 = _load(f"{base}/run7_block_skip_depth/block_skip.json")
    results = (RESULTS / base / "README.md").read_text().splitlines()
    for line in bench.table(run7["rows"]).splitlines():  # the cost model's columns follow
        assert any(r.startswith(line) for r in results), line
    assert all(c["ok"] for c in run7["checks"]) and "ERROR SUMMARY: 0 errors" in (
        RESULTS / base / "run7_block_skip_depth" / "memcheck.log").read_text()
    # the layers' skipping kernels today are run 11's (round three)
    run11 = _load("issue33_h200_2026-11-29/run11_skip_tuned/block_skip.json")
    cands = bench.kernels_for(bench.ints("1,16"), bench.parse_shapes(bench.SHAPES))
    assert sorted(c["name"] for c in cands) == sorted(run11["digests"])
    from marlin_dsl import CUDA
    from marlin_dsl.compiler import compile_gemm
    from marlin_dsl.targets.cuda.launch import gemm_inout_inputs
    from marlin_dsl.targets.cuda.printer import print_cuda
    for c in cands:
        if c["format"] != "fp4_blockpattern":
            continue
        kernel = compile_gemm(c["gemm"], CUDA).kernel
        src = print_cuda(kernel, inout_inputs=gemm_inout_inputs(kernel))
        # run 11 measured these kernels before 512-thread blocks carried __launch_bounds__
        # (issue 35): the same text, without the bounds' line in the signature
        if kernel.threads == 512:
            assert src.attrs.pop("launch_bounds") == 512, c["name"]
        assert src.digest == run11["digests"][c["name"]], c["name"]
    ratios: dict[str, list[float]] = {}
    for run in ("run6_block_skip", "run7_block_skip_depth"):
        rows = _load(f"{base}/{run}/block_skip.json")["rows"]
        for key in {(r["K"], r["N"], r["M"], r["sparsity"]) for r in rows if r["subject"] == "fp4"}:
            mine = [r for r in rows if (r["K"], r["N"], r["M"], r.get("sparsity")) == key]
            dense = next(r for r in mine if r["subject"] == "fp4")["time_ns"]
            best = min(r["time_ns"] for r in mine if r["subject"] == "fp4_blockpattern")
            kind = "none" if key[3] in ("random50", "blocks8_50") else f"{key[3]}:{run}"
            ratios.setdefault(kind, []).append(dense / best)
    text = " ".join(BENCH_README.split())
    for kind, words in (("clustered75:run7_block_skip_depth", "{}x dense fp4 at 75% clustered"),
                        ("clustered50:run7_block_skip_depth", "{}x at 50% clustered"),
                        ("none", "{}x where nothing is skipped")):
        lo, hi = min(ratios[kind]), max(ratios[kind])
        assert words.format(f"{lo:.2f}-{hi:.2f}") in text, (kind, lo, hi)


def test_block_skip_layers_round() -> None:
    """Issue 33, round three: run 11's table (with the cost model's bytes) is in the results
    README; the ranges bench/README.md quotes for the layers' skipping kernels come from run 11
    and the layer's from runs 12 and 13; every check passed and memcheck found nothing; the
    skip limits the README states are the code's."""
    import importlib.util

    from marlin_dsl.targets.cuda.tuning import SKIP_MAX_STORED, SKIP_MAX_STORED_SMALL

    spec = importlib.util.spec_from_file_location("block_skip_gpu", ROOT / "bench" / "block_skip_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    base = "issue33_h200_2026-11-29"
    run11 = _load(f"{base}/run11_skip_tuned/block_skip.json")
    results = (RESULTS / base / "README.md").read_text()
    for line in bench.table(run11["rows"], bench.predicted_mb(run11["rows"])).splitlines():
        assert line in results, line
    assert all(c["ok"] for c in run11["checks"]) and "ERROR SUMMARY: 0 errors" in (
        RESULTS / base / "run11_skip_tuned" / "memcheck.log").read_text()
    ratio: dict[tuple, float] = {}
    for key in {(r["K"], r["N"], r["M"], r["sparsity"]) for r in run11["rows"] if r["subject"] == "fp4"}:
        mine = [r for r in run11["rows"] if (r["K"], r["N"], r["M"], r.get("sparsity")) == key]
        dense = next(r for r in mine if r["subject"] == "fp4")["time_ns"]
        ratio[key] = dense / next(r for r in mine if r["subject"] == "fp4_blockpattern")["time_ns"]
    large = [(4096, 14336), (14336, 4096)]

    def span(kinds, shapes) -> str:
        vals = [v for (k, n, _, kind), v in ratio.items() if kind in kinds and (k, n) in shapes]
        return f"{min(vals):.2f}-{max(vals):.2f}x"

    text = " ".join(BENCH_README.split())
    assert f"{span(['clustered50'], large)} dense fp4 at 50% clustered and {span(['clustered75'], large)}" in text
    assert f"{span(['random50'], large + [(4096, 4096)])} where every vector is stored" in text
    assert f"at most {SKIP_MAX_STORED} of the vectors are stored ({SKIP_MAX_STORED_SMALL} under 2^25" in text
    layer = [r["fp4"] / r["fp4_blockpattern"] for run in ("run12_layer", "run13_layer")
             for r in _load(f"{base}/{run}/layer_skip.json")["rows"]
             if r["M"] == 16 and r["skipping"] and r["sparsity"].startswith("clustered") and (r["K"], r["N"]) in large]
    assert f"{min(layer):.2f}-{max(layer):.2f}x the fp4 layer" in text
    for run in ("run12_layer", "run13_layer"):
        assert all(c["ok"] for c in _load(f"{base}/{run}/layer_skip.json")["checks"])
