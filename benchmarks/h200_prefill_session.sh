#!/usr/bin/env bash
# Issue 27's prefill at 32K on one H200, one stage per call (each inside one 600 s call):
#   parts    the index-scores kernel (every slot block vs the causal ones, 4 / 8 / 16 queries a program) and the
#            top-k variants at a 32K prompt's 2,048-token chunk, each with its kernels from a device trace; then the
#            32K prefill through benchmarks.e2e with its per-part profile
#   parts2   after the new top-k: the top-k variants at decode's shapes (T = 4; B = 1, 64; 32K and 128K slots), then
#            the 32K prefill at the auto chunk, 4,096 and 8,192 with its per-part profile
#   e2e3     the top-k forms at B·T = 4 … 256 (the one-reduction threshold), then benchmarks.e2e at B = 1 (32K, 8K,
#            1K prompts, the auto chunk)
#   e2e4     benchmarks.e2e at B = 8 and 64 (1K and 4K prompts): the round at B = 64, 4K context
#   tests    the GPU tests of the kernels on the user's path and of the FP8 MLA cache (the TPU cases skip there)
#   verify4k the verification forward at B = 8, 64, 256 with a 4K cache (B = 256: its kernels per part)
#   verify32k the verification forward at B = 64, 256 with a 32K cache, its kernels per part (issue 27: 0.43 of its
#            floor at B = 256, out of memory at B = 256 × 32K on 2026-12-02)
#   mgpu     the Mosaic GPU index scores: tests compiled, timed beside Triton and XLA at decode and prefill shapes;
#            the re-runs of the GPU failures; B = 256 × 32K through the verification forward
#   mgpu2    the Mosaic kernel with fp8 keys and its dynamic bound: tests, decode and prefill shapes (12:42: -x stopped
#            the tests at the index-sharing test, since rewritten)
#   mla      the Mosaic GPU sparse-MLA kernel's and the Mosaic index scores' GPU tests, then both sparse-MLA kernels
#            timed beside XLA (4K and 32K caches), then the index scores at 128K
#   mla2     the same after the jax 0.11.2 fix (13:40: every compiled Mosaic sparse-MLA test failed lowering on 0.11.2)
#   mla3     the same, without the staging padding (14:00: CUDA_ERROR_MISALIGNED_ADDRESS: TMA destinations 128 B apart)
#   mla4     (not run yet) all the Mosaic sparse-MLA GPU tests; Config.contiguous_relayout timed beside the rest
#   e2e5     (superseded: B = 256 × 32K ran in v256, e2e at B = 1 is in small) e2e at 32K / 8K; B = 256 × 32K
#   fp8mg    the Mosaic GPU FP8 grouped matmul's tests and its speed beside the Triton kernel; mla4's failures
#   fp8mg2   the same after the 8-row-aligned tiles (16:56: 21 of 21 tests passed)
#   fp8mg3   (not run yet) the Mosaic FP8 kernel's shared output staging and two-subtile variants, timed (the bf16
#            experts' block_m 128 sweep it also held ran in v256)
#   fp8e2e   [IMPL] (21:34 2026-12-04: both rows finished under auto) benchmarks.e2e with FP8 weights: B = 64 × 1K
#            and a 32K prompt, under auto (the prefill rule) or through one FP8 kernel
#   mla5     (21:37) whether jax_triton runs on the image (tools/jax_triton_probe.py); the Mosaic sparse-MLA
#            gather's copy variants (whole rows, 4 issuing warps): their GPU tests, then timed beside auto's config
#            and the Triton kernel at B = 64 / 8 / 1
#   mla6     (21:58) after mla5 (whole rows from 4 warps the Mosaic default; auto: Mosaic from 64 queries a
#            call, and over an fp8 cache): the GPU tests of the model's Mosaic path, the kernels at B = 1, then the
#            verification forward at B = 64 / 256 (4K) and B = 256 × 32K, each with its kernels per part
#   v256     (22:10) the bf16 experts at 1,024 tokens (tokamax block configs swept); B = 256 × 32K verification
#   small    (not run yet) the Triton sparse-MLA kernel at B = 1 after MAX_SPLITS 16, GPU tests, both kernels at B = 8, 1
#   impls    (07:21) e2e at B = 1, 8 with each sparse-MLA kernel forced; the draft step at B = 64, 4K vs 128K
#   fp8nk    (13:01) the FP8 grouped matmul over [E, N, K] codes (register operand), timed beside Triton and the
#            [E, K, N] Mosaic kernel (the form since removed)
#   notritonfp8 (15:17 2026-12-05) the FP8 paths' GPU tests through the Mosaic kernel after the Pallas Triton FP8 kernel's removal
#   tokens3  (15:35 2026-12-05, cut by its bounds) test_speculative's GPU cases (tp > 1 skip on one GPU), then the kernels' token tests
#   notriton (not run yet) the changed paths' GPU tests after the Triton sparse MLA went; the draft step at B = 1, 8
#   dbuf     (12:26 2026-12-04) the double-buffered Mosaic sparse MLA: compiled tests, timed beside the default
#   gemms    (12:35 2026-12-04) the verification forward with XLA's Triton GEMM fusions and with cuBLAS (B = 64, 256)
#   e2eb1    (not run yet) e2e at B = 1 (32K, 8K prompts) under the shape-aware auto
#   caches   benchmarks.e2e at a 32K prompt, B = 1, with vLLM's V3.2 storage (fp8 MLA cache and fp8 indexer keys)
#            and with bf16 caches, in one call
#   profile  (15:22 2026-12-04) Mosaic GPU's on-device profile of the sparse MLA's phases (sparse_mla_profile)
#   ids      (not run; ids_before_dots timed at 15:29 in a scratch run instead) ids_before_dots beside auto
#   ablate   (15:48 2026-12-04) the sparse MLA with phases removed (sparse_mla_ablate); the model path's GPU tests
#   verify64x3 (15:54 2026-12-04) the verification forward at B = 64, three processes (one finished its 115 s)
#   vrelay   (18:10 2026-12-04) Config.values_relayout (its flag removed 2026-12-05): compiled tests, then
#            benchmarks.sparse_mla at B = 64 and 8
#   vrelay2  (not run) the ablation of Config.values_relayout's form (not worth it: vrelay found it no faster; its
#            flag removed 2026-12-05)
#   splits   (18:31 2026-12-04) the sparse MLA's splits swept (sparse_mla_splits); MLA's projections laid out ahead
#   splits2  after the one-wave rule: the sparse MLA's compiled tests; the index scores' splits swept at 128K
#   splits3  the user's path after it: e2e at B = 1 and 8, the verification forward at B = 64 (3 runs), GPU tests
#   overlap  (18:56 2026-12-04) the index scores' Config.overlap_queries: compiled tests, then timed at T = 4
#   kregs    (21:20 2026-12-04) the index scores' Config.keys_in_registers: compiled tests, then timed
#   handoff  (21:20, 21:33 2026-12-04) one hand-off and one wgmma of the sparse MLA's step, each alone (mgpu_handoff)
#   topk     (run as v32topk) the top-k forms at verification's 256 queries, 4K and 32K caches
#   v32topk  (2026-12-06 05:49, an H100) topk, then verify32k, in one call
#   topk1    (05:59 2026-12-06, an H100) the top-k's k-th key kernel: GPU tests, its rows beside XLA's, verification at 32K with it
#   topk2    (06:07 2026-12-06 device clock, an H100) its wider loop steps compiled and timed; verification at 4K and 32K with it
#   topk3    (06:16 2026-12-06, an H100: B = 1 and 8 rows, then 12 tests passed before the call's time ran out) the kernel
#            beside the library by queries a call (auto's rule); its V3.2-shape tests
#   topk4    (07:58 2026-12-06, an H100: faster at 64, 128, 2,048, 4,096 queries; 32K × B = 32 cut) the k-th key kernel at a 32K prompt's prefill chunks and at 64 / 128 queries a call
#   topk6    (08:31 2026-12-06, an H100: 10 + 1 passed, none failed, cut by the device budget) the k-th key kernel's GPU tests and the user path's token tests, auto from 64 queries up
#   onescan  (08:24 2026-12-06, an H100: the packed scan slower, reverted; exits 2 since)
#   wgroups  (10:59 2026-12-06, an H100: the split rows wrong compiled, removed; exits 2 since) the k-th key kernel's row
#            over 2 and 4 warpgroups and its tie cutoff: compiled tests, timed B = 1, 8, 64
#   wgroups2 (never run; exits 2) the warpgroup forms at a 32K prompt's prefill chunk
#   tokens5  (11:03 2026-12-06, an H100: 2 passed, 3 skipped) the kernels' token tests tokens3 did not reach
#   tiecut   (11:07 2026-12-06, an H100) the tie cutoff at a 2,048-query prefill chunk; the top-k's model-level GPU tests
#   tiecut2  (11:15 2026-12-06, an H100) the tie cutoff's compiled tests, its rows at 64 / 256 queries, a first chunk
#   tiecut3  (11:22 2026-12-06, an H100: 4 passed) the model-level GPU tests with the tie cutoff the default
#   audit    (13:54 2026-12-06, an H100: 8 + 21 passed) the GPU-only tests strengthened without a GPU on 2026-12-06
#            (loud experts, margins), then the auto paths' and user path's token tests under the tie cutoff
#   topkforms (14:09, 14:16 2026-12-06, an H100; exits 2 since) the k-th key kernel's pass forms at the CLI's shapes
#   topkforms2 (14:27 2026-12-06, an H100: cut in its tests by the budget) the k-th key kernel's packed sums and
#            last-chunk step timed beside its old form (and packed_lazy since; its tests moved to topktests)
#   topktests (not run yet) the top-k kernel's compiled tests
#   lower61  (not run yet) V3.2's 61 layers: the CLI's prefill and round lowered and compiled on the GPU (abstract
#            weights), `auto` experts, B = 8 and 64 over 4K prompts: the first request's wait, XLA's part included
#   topkpass (not run yet; its first command's tests ran bare at 09:43 2026-12-07 on an H100: 36 passed) the top-k
#            kernel padded and its passes a loop (2026-12-07): its compiled tests, e2e at B = 64 (whose round took
#            225 s to lower before), the pass forms timed
#   gmm16m   (08:45 2026-12-07, an H100) the FP8 case alone (it passed in 32 s with its compile cached: the failure
#            was the 80 s bound on its compile), then e2e at B = 8 (ran) and 64 (cut: its round lowered in 225 s)
#   gmm16k   (not run yet) gmm16g's FP8 failure in full, the 16-bit auto case
#   gmm16g   (06:04 2026-12-07, an H100) gmm16f's tests, the verification forward at B = 256 (4K) with our experts kernel vs
#            tokamax's, e2e at B = 64
#   gmm16e   (not run yet) the user's path (e2e B = 8, 64) and the experts' model-level GPU tests under the new auto
#   gmm16v   (00:37 2026-12-07, an H100) the 16-bit Mosaic experts in the verification forward and the draft step
#   gmm16t   (not run yet) gmm16 cut to ~2 minutes
#   gmm16    (00:34 2026-12-07, an H100: 35 passed before its 100 s bound) the 16-bit Mosaic GPU grouped matmul: compiled tests, timed beside tokamax
#   topkfit  (2026-12-06 evening) topktests' cut speculative test, fitcheck, verify4k at B = 8 and 64
#   v4kfit   (not run yet) verify4k then fitcheck in one call
#   fitcheck (not run yet) the weights-fit check against a GPU's allocator, the FP8 split-block refusals, convert
#   topk5    (not run yet) e2e at a 32K prompt, B = 1, the top-k auto and the kernel forced
#   capacities (15:20 2026-12-07, an H100; cut in its 32,768 rows) the index scores and the top-k at the CLI's real capacities beside the round ones
#   uneven   (its sweep ran bare at 15:27 2026-12-07, an H100; its tests not yet) the index scores' uneven splits: compiled tests, swept at the CLI's capacities
#   e2eidx   (not run yet) e2e at B = 1 over 4K prompts under auto, then with the index scores in XLA
#   padsel   (15:15 2026-12-07, an H100; its index-sharing test cut by the bound) the sparse MLA over selections padded to whole steps vs to padded_entries' width
#            (index_share's 2,050 entries, a short request's 1,059 slots), then the kernel's and the index-sharing
#            compiled tests
#   fp8gpu   (21:28 2026-12-04) the FP8 paths' GPU tests (the prefill rule and the bounded bytes layout)
#   fp8q     (not run yet) the index scores' float8 × float8 form timed and tested; the user path's GPU tests
#   fp8round (not run yet) the draft step per part with FP8 and bf16 weights at B = 64 (the FP8 round's 0.58)
#   path4    (no machine 2026-12-04 21:40) the user path's GPU tests, then e2e at B = 8, 1
#   ring     (03:42 2026-12-05) the landing ring and qk_ahead: compiled tests, timed beside auto (both slower; the ring
#            and its stage ring2 removed since; qk_ahead's flag removed 2026-12-05)
#   fp8q2    (04:18 2026-12-05) the float8-q index scores' compiled tests at the float8 wgmma's tolerance with
#            FLOAT8_SCORES_DOT on; the three key forms at T = 1; then fp8round's profile
#   dense    (09:12 2026-12-05) MLA's dense absorbed attention, 16-bit form vs the fp32 one; V3 bf16 speculative == plain on
#            the GPU; the FP8 round at B = 64 over a 1K prompt
#   shortreq (09:32 2026-12-05) a V3.2 request under index_topk through the sparse kernel: the forms timed, its GPU tests,
#            the FP8 round at B = 64 over a 1K prompt
#   tokens   (not run yet) the GPU's token tests after the random init's change
#   shortbf16 (not run yet) e2e with bf16 weights at 1K prompts, B = 64 and 8, after the kernel took short requests;
#            B = 64 sampled with top-p
#   tokens2  (10:02 2026-12-05: its first command's B = 1 rows only, the rest cut by the device budget) the dense form against the kernel at B = 1 and 8, then tokens' tests bounded to ~5 min
#   compact  (15:24 2026-12-05) the FP8 kernel's grid over the non-empty groups, timed; the user's FP8 path at B = 1, 64
#   apart    (18:17 2026-12-05: ptxas refused every four-warpgroup kernel) the sparse MLA with P · V in two values
#            warpgroups: compiled tests, timed beside auto
#   apart2   (18:31) the same after one setmaxnreg ahead of both values warpgroups, with the PTX and ptxas's report
#            dumped: refused the same way (the roles dispatched through a jump table)
#   apart3   (18:45) the same with the four roles chosen two tests deep: refused the same way; the router's GPU tests
#   apart4   (19:0x: the machine stopped answering) the same with each values warpgroup's half in two m64n128 wgmmas
#   apart5   (19:00) apart4 bounded: compiled, 12 tests passed, no faster. apart–apart5 and vrelay2 now exit 2: the
#            forms they ran were removed on 2026-12-05
#   tokens4  (not run yet) test_speculative's cases tokens3 did not reach
#   router   (15:44 2026-12-05) the router's logits, fp32 dot vs three bf16 dots, by token count
#   heads    (22:38 2026-12-05, an H100; exits 2 since) the sparse-MLA kernel's heads-major q~ / output: no faster,
#            removed the same evening
#   xover3   (04:41 2026-12-06, an H100: the plain-store exchanges equal, async_store_smem hung; the crossover correct,
#            1.19-1.20x slower; the forward with it forced no faster) xover2 bounded to one call, then the
#            verification forward at B = 64 with the crossover forced (its compiled tests passing first)
#   crossover (never run) the crossover probe's exchange compiled
#   xover    (00:25 2026-12-06, an H100: the probe hung, the kernel crashed) the probe, then the
#            crossover by async_store_smem: compiled tests, its speed beside the double-buffered form
#   xover2   (superseded by xover3, which ran it) which cross-CTA exchange works
#            (tools/crossover_variants.py), then the crossover by plain stores into the peer: timed, compiled tests.
#            xover–xover3 and crossover now exit 2: the crossover, its probes and tests were removed on 2026-12-06
#            (last at 03b5fef)
#   gemms2   (22:43 2026-12-05, an H100: XLA fastest or within a few µs nearly everywhere) V3.2's dense linears at M = 256 (and 64, 1,024) on XLA's GEMM beside jax's Hopper matmul
#            rasterised over M and tokamax's grouped matmul over one group (benchmarks.dense_gemms)
#   fp8      benchmarks.e2e with FP8 weights kept as codes: 1K and 32K prompts at B = 1, 1K at B = 64
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
QUIET="TPU|libtpu|Source Location|InitGoogle|E0000|E1203|I0000|errors.h|learning/|Deprecat|return rule|^$"
# verify_32k SECONDS: the verification forward at 32K with its kernels per part; 4 layers on an H200 (B = 64 and
# 256), 3 on an H100 (B = 64 only: B = 256's 35 GB of caches beside 55 GB of weights do not fit 80 GB)
verify_32k() {
  local layers=3 batches=(64)
  if nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | awk '{exit !($1 > 120000)}'; then
    layers=4 batches=(64 256)
  fi
  run "$1" verify_32k.md python3 -m benchmarks.verify_forward --layers "$layers" -k 3 --forms absorbed \
    --batch "${batches[@]}" --capacity 32768 --profile --iters 5
}
case "${1:?stage}" in
  parts)
    run 200 prefill_parts.md python3 -m benchmarks.prefill_parts --capacity 33280 --chunk 2048 --position 16384 \
      --trace
    run 280 e2e_32k_profile.md python3 -m benchmarks.e2e --prompt 32768 --batch 1 --profile --iters 5 \
      --out "$OUT/e2e_32k.json"
    ;;
  parts2)
    run 150 dsa_parts_t4.md python3 -m benchmarks.dsa_parts --capacity 33280 131072 --batch 1 64 --tokens 4 --iters 10
    run 360 e2e_32k_chunks.md python3 -m benchmarks.e2e --prompt 32768 --batch 1 --prefill-chunk 0 4096 8192 \
      --profile --iters 5 --out "$OUT/e2e_32k_chunks.json"
    ;;
  e2e3)
    run 100 topk_rows.md python3 -m benchmarks.dsa_parts --capacity 33280 --batch 1 4 8 16 64 --tokens 4 \
      --parts top-k --iters 10
    run 440 e2e_b1.md python3 -m benchmarks.e2e --prompt 32768 8192 1024 --batch 1 --iters 5 --out "$OUT/e2e_b1.json"
    ;;
  e2e4)
    run 400 e2e_b8_b64.md python3 -m benchmarks.e2e --prompt 1024 4096 --batch 8 64 --max-prefill-tokens 300000 \
      --iters 5 --out "$OUT/e2e_b8_b64.json"
    ;;
  tests)  # -v --tb=short: each test's verdict as it ends and the failures' reasons, even if the call's time runs out
    run 240 gpu_tests.txt python3 -m pytest -v --tb=short -p no:cacheprovider tests/test_index_scores_kernel.py \
      tests/test_user_path_kernels.py tests/test_sparse_mla_mgpu.py tests/test_fp8_mla_cache.py \
      tests/test_experts_gpu.py -k "not tpu"
    ;;
  verify4k)  # the 4-layer target on an H200; an H100 does not hold it (74 GB of arguments, 2026-12-05 19:02): 3 layers
    layers=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | awk '{print ($1 > 120000) ? 4 : 3}')
    run 170 verify_4k.md python3 -m benchmarks.verify_forward --layers "$layers" -k 3 --forms absorbed --batch 8 64 \
      --capacity 4096 --iters 5
    run 170 verify_4k_b256.md python3 -m benchmarks.verify_forward --layers "$layers" -k 3 --forms absorbed \
      --batch 256 --capacity 4096 --profile --iters 5
    ;;
  gmm16e)  # (not run yet) the user's path under auto since the 16-bit experts kernel took decode and verification
           # sizes (2026-12-07): the experts' model-level tests with a CPU device beside the GPU (their per-token loop
           # reference is a pure_callback, which needs one) first, as what auto's change must pass; then e2e at B = 8
           # and 64 over 4K prompts (the round's experts in our kernel, the prefill's in tokamax's, read from the
           # compiled programs)
    JAX_PLATFORMS=cuda,cpu run 200 gpu_tests_gmm16e.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider \
      --timeout 120 tests/test_experts.py tests/test_experts_gpu.py tests/test_auto_gpu_paths.py \
      -k "greedy_tokens or mtp_layer or speculative"
    run 300 e2e_gmm16.md python3 -m benchmarks.e2e --prompt 4096 --batch 8 64 --iters 5
    ;;
  gmm16f)  # (not run yet) gmm16e cut to what ~7 minutes of device time hold: the auto path's GPU tests (the 16-bit
           # experts kernel's speculative == plain cases, named and picked by auto, first), then e2e at B = 64 alone
    JAX_PLATFORMS=cuda,cpu run 180 gpu_tests_gmm16f.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider \
      --timeout 100 tests/test_auto_gpu_paths.py tests/test_experts_gpu.py tests/test_experts.py \
      -k "16_bit_experts or mtp_layer or greedy_tokens or fp8_kernel_gives"
    run 200 e2e_gmm16f.md python3 -m benchmarks.e2e --prompt 4096 --batch 64 --iters 5
    ;;
  jitted)  # (13:25 2026-12-07, an H100: 8 tests passed, the top-k one cut by the bound, passed alone at 13:34; e2e and the
           # cache ran) the kernels' entries jitted per launch (2026-12-07) on a GPU: the model-level GPU tests of
           # every auto path (speculative == plain through each kernel, tokamax's and our experts, the top-k
           # kernel's), then e2e at B = 64 over 4K prompts (issue 27's round row; its round took 225 s to lower before)
    JAX_PLATFORMS=cuda,cpu run 230 gpu_tests_jitted.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider \
      --timeout 120 tests/test_auto_gpu_paths.py tests/test_experts_gpu.py tests/test_topk_mgpu.py \
      -k "not tpu and (speculative or mtp_layer or compiled_program)"
    run 220 e2e_jitted.md python3 -m benchmarks.e2e --prompt 4096 --batch 64 --iters 5
    for i in 1 2; do  # --compilation-cache on a GPU; the tiny model compiles under JAX's 1 s threshold for writing
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 run 45 cli_cache$i.json python3 -m jax_mtp.decode --random-tiny \
        --json --compilation-cache /tmp/jax_mtp_cli_cc
    done
    ;;
  cache61)  # (its lowering_time runs ran bare at 13:31 2026-12-07 on an H100: 154 s cold, 35 s warm) V3.2's 61 layers' two programs lowered and compiled on this GPU from abstract weights, twice
           # over one persistent compilation cache (the CLI's --compilation-cache since 2026-12-07): cold, then what a
           # second run of the same shapes waits; then the CLI twice over a fresh cache (its JSON's programs_read,
           # the same tokens)
    JAX_COMPILATION_CACHE_DIR=/tmp/jax_mtp_cc61 run 280 lower61_b8_cold.md python3 -m benchmarks.lowering_time \
      --layers 61 --batch 8 --prompt 4096 --moe-impl auto --compile
    JAX_COMPILATION_CACHE_DIR=/tmp/jax_mtp_cc61 run 150 lower61_b8_warm.md python3 -m benchmarks.lowering_time \
      --layers 61 --batch 8 --prompt 4096 --moe-impl auto --compile
    for i in 1 2; do  # the tiny model's programs compile in under JAX's 1 s threshold for writing: 0 writes every one
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 run 60 cli_cache$i.json python3 -m jax_mtp.decode --random-tiny \
        --json --compilation-cache /tmp/jax_mtp_cli_cc
    done
    ;;
  jitkern)  # (its kernel_equals tests ran bare at 13:34 2026-12-07 on an H100: 72 passed) the jitted kernels' own compiled tests (index scores, sparse MLA, both grouped matmuls),
            # then the top-k pass forms timed (a loop vs unrolled)
    run 330 gpu_tests_jitkern.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 120 \
      tests/test_grouped_matmul_mgpu.py tests/test_fp8_grouped_matmul_mgpu.py tests/test_sparse_mla_mgpu.py \
      tests/test_index_scores_mgpu.py -k "equals or positions_bound or weighs_nothing or rounded or on_the_gpu \
      or leaves or models_attention or ids_loaded or double_buffered or one_buffer or copy_variants"
    run 200 topk_passes.md python3 -m benchmarks.topk_forms --iters 20
    ;;
  lower61)  # (not run yet) the CLI's two programs for V3.2's 61 layers compiled on this GPU from abstract weights
             # (benchmarks.lowering_time --compile): the lowering (11 s on a CPU since 2026-12-07, 104 s before) and
             # XLA's compile, which no CPU can time for a GPU; tokamax's jitted prefill experts under auto
    run 280 lower61_b8.md python3 -m benchmarks.lowering_time --layers 61 --batch 8 --prompt 4096 --moe-impl auto \
      --compile
    run 280 lower61_b64.md python3 -m benchmarks.lowering_time --layers 61 --batch 64 --prompt 4096 --moe-impl auto \
      --compile
    ;;
  topkpass)  # (its tests and pass forms ran bare at 17:41 2026-12-07 on an H100: 55 passed; the loop as fast) the top-k kernel since 2026-12-07 (its row padded in shared memory, its passes a loop:
              # 0.2 s to lower, not 11): its compiled tests, the 4,864-slot cases with padding among them; e2e at
              # B = 64 over 4K prompts (the row lowering cut at 08:52 and 09:02); the pass forms timed
    run 170 gpu_tests_topkpass.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 100 \
      tests/test_topk_mgpu.py -k "gpu or tie_cutoff or equals"
    run 220 e2e_topkpass.md python3 -m benchmarks.e2e --prompt 4096 --batch 64 --iters 5
    run 180 topk_passes.md python3 -m benchmarks.topk_forms --iters 20
    ;;
  gmm16m)  # (08:45 2026-12-07, an H100; see the header) the FP8 kernel's speculative == plain case alone, its traceback in full (~1.5 minutes);
           # then e2e at B = 8 and 64 over 4K prompts at the auto chunk now sized to the memory left, the prefill
           # without prompt-wide hidden states (06:12–06:16 2026-12-07: both ran an H100 out of memory)
    JAX_PLATFORMS=cuda,cpu run 90 gpu_tests_gmm16m.txt python3 -m pytest -v -rfE --tb=long -p no:cacheprovider \
      --timeout 80 tests/test_auto_gpu_paths.py -k "fp8_kernel_gives"
    run 280 e2e_gmm16m.md python3 -m benchmarks.e2e --prompt 4096 --batch 8 64 --iters 5
    ;;
  gmm16k)  # (not run yet) gmm16g's tests cut by its bound (06:04 2026-12-07, an H100): why the FP8 kernel's
           # speculative == plain case failed (its reason in full, with a CPU device beside the GPU and without), and the
           # 16-bit kernel's auto case, which did not finish inside the bound
    JAX_PLATFORMS=cuda,cpu run 100 gpu_tests_gmm16k_fp8.txt python3 -m pytest -v -rfE --tb=long -p no:cacheprovider \
      --timeout 90 tests/test_auto_gpu_paths.py -k "fp8_kernel_gives or (16_bit_experts and auto)"
    run 70 gpu_tests_gmm16k_cuda.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 60 \
      tests/test_auto_gpu_paths.py -k "fp8_kernel_gives"
    ;;
  gmm16g)  # (not run yet) what one call holds after two sessions without a GPU: gmm16f's tests (the 16-bit experts
           # kernel's speculative == plain cases, auto's pick), then the verification forward at B = 256 over a 4K
           # cache with our experts kernel beside tokamax's (issue 27's one open verification row), then e2e at B = 64
    JAX_PLATFORMS=cuda,cpu run 160 gpu_tests_gmm16g.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider \
      --timeout 100 tests/test_auto_gpu_paths.py tests/test_experts_gpu.py tests/test_experts.py \
      -k "16_bit_experts or mtp_layer or greedy_tokens or fp8_kernel_gives"
    layers=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | awk '{print ($1 > 120000) ? 4 : 3}')
    run 200 verify_4k_b256_gmm16.md python3 -m benchmarks.verify_forward --layers "$layers" -k 3 --forms absorbed \
      --batch 256 --capacity 4096 --moe-impls auto tokamax_gpu --profile --iters 5
    run 190 e2e_gmm16g.md python3 -m benchmarks.e2e --prompt 4096 --batch 64 --iters 5
    ;;
  gmm16v)  # (00:37 2026-12-07, an H100; its 32K rows cut by the 200 s bound, run bare at 00:42) the 16-bit Mosaic experts on the user's shapes beside tokamax: the
           # verification forward at B = 64 over 4K and 32K caches, then the MTP draft step at B = 1 and 8
    run 200 verify_gmm16.md python3 -m benchmarks.verify_forward --layers 3 -k 3 --forms absorbed --batch 64 \
      --capacity 4096 32768 --moe-impls auto mosaic_gpu --iters 5
    run 150 mtp_step_gmm16.md python3 -m benchmarks.mtp_step --preset deepseek_v32 --batch 1 8 --capacity 4096 \
      --moe-impls auto mosaic_gpu --iters 10
    ;;
  gmm16t)  # (not run yet) gmm16 cut to what ~1 minute of device time holds: the 16-bit kernel's compiled tests and
           # the experts' GPU tests through it, then the experts at 1,024, 256 and 1 tokens beside tokamax
    run 60 gpu_tests_gmm16t.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 30 \
      tests/test_grouped_matmul_mgpu.py tests/test_experts_gpu.py -k "(equals or spanning or mosaic) and not lowers"
    run 90 moe_gmm16t.md python3 -m benchmarks.moe_experts --batch 1024 256 1 --impls tokamax_gpu mosaic_gpu \
      --experts-only --iters 3
    ;;
  gmm16)  # (00:34 2026-12-07, an H100) the 16-bit grouped matmul on Mosaic GPU (kernels/grouped_matmul_mgpu.py, built 2026-12-06
          # evening on a CPU): its compiled tests, the FP8 kernel's (their shared copy and store since), the experts'
          # GPU tests through it; the routed experts timed beside tokamax at 1, 256 and 1,024 tokens (B = 1's draft
          # step, B = 64's and B = 256's verification); last, topkfit's mended load-path tests
    run 100 gpu_tests_gmm16.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 60 \
      tests/test_grouped_matmul_mgpu.py tests/test_fp8_grouped_matmul_mgpu.py tests/test_experts_gpu.py \
      tests/test_experts.py -k "not race and (mosaic \
      or spanning or compiled_program or 16_bit or equals or refuses or config) and not lowers"
    run 150 moe_gmm16.md python3 -m benchmarks.moe_experts --batch 1 256 1024 --impls tokamax_gpu mosaic_gpu \
      --experts-only --iters 5
    run 60 gpu_tests_fitcheck2.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 50 \
      tests/test_weights_fit.py tests/test_convert.py tests/test_fp8_weights.py \
      -k "too_little or refuses_weights or splitting_its or would_pick_nothing"
    ;;
  topkfit)  # (2026-12-06 evening) what topktests' bound cut (its speculative == plain test), fitcheck, then the
            # verification forward at B = 8 and 64 over a 4K cache, in one call
    run 180 gpu_tests_topk4.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 170 \
      tests/test_topk_mgpu.py -k "speculative_equals_plain"
    run 150 gpu_tests_fitcheck.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 140 \
      tests/test_weights_fit.py tests/test_convert.py tests/test_fp8_weights.py -k "fit or convert or copy or refuse"
    layers=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | awk '{print ($1 > 120000) ? 4 : 3}')
    run 170 verify_4k.md python3 -m benchmarks.verify_forward --layers "$layers" -k 3 --forms absorbed --batch 8 64 \
      --capacity 4096 --iters 5
    ;;
  v4kfit)  # (not run yet) verify4k, then fitcheck, in one call (one machine start for both; 2026-12-06 evening)
    layers=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | awk '{print ($1 > 120000) ? 4 : 3}')
    run 170 verify_4k.md python3 -m benchmarks.verify_forward --layers "$layers" -k 3 --forms absorbed --batch 8 64 \
      --capacity 4096 --iters 5
    run 170 verify_4k_b256.md python3 -m benchmarks.verify_forward --layers "$layers" -k 3 --forms absorbed \
      --batch 256 --capacity 4096 --profile --iters 5
    run 200 gpu_tests_fitcheck.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 150 \
      tests/test_weights_fit.py tests/test_convert.py tests/test_fp8_weights.py -k "fit or convert or copy or refuse"
    ;;
  verify32k)  # 4 layers on an H200 (B = 64 and 256); 3 on an H100, B = 64 only (B = 256's 35 GB of caches beside 55 GB
              # of weights do not fit 80 GB)
    verify_32k 300
    ;;
  fp8)
    run 280 e2e_fp8.md python3 -m benchmarks.e2e --weights fp8 --prompt 1024 32768 --batch 1 --iters 5 \
      --out "$OUT/e2e_fp8_b1.json"
    run 200 e2e_fp8_b64.md python3 -m benchmarks.e2e --weights fp8 --prompt 1024 --batch 64 \
      --max-prefill-tokens 70000 --iters 5 --out "$OUT/e2e_fp8_b64.json"
    ;;
  mgpu)  # the Mosaic GPU index scores (tests compiled, timed beside Triton and XLA), the GPU failures' re-runs, the
    # FP8 MLA cache's GPU tests, then B = 256 × 32K through the verification forward with one set of caches
    run 170 gpu_tests_mgpu.txt python3 -m pytest -v --tb=short -p no:cacheprovider tests/test_index_scores_mgpu.py \
      tests/test_user_path_kernels.py::test_index_sharing_runs_through_the_kernel_with_xlas_tokens \
      tests/test_index_scores_kernel.py::test_positions_bound_the_scored_slots tests/test_fp8_mla_cache.py \
      tests/test_auto_gpu_paths.py -k "index_scores_kernel or mgpu or fp8_mla or positions or index_sharing"
    run 90 index_scores_mgpu.md python3 -m benchmarks.dsa_parts --capacity 32768 131072 --batch 1 64 --tokens 4 \
      --parts scores --iters 10
    run 60 index_scores_mgpu_prefill.md python3 -m benchmarks.dsa_parts --capacity 33280 --batch 1 --tokens 2048 \
      --parts scores --iters 5
    run 170 verify_32k_b256.md python3 -m benchmarks.verify_forward --layers 4 -k 3 --forms absorbed --batch 256 \
      --capacity 32768 --profile --iters 5
    ;;
  mgpu2)  # (not run yet) after fp8 keys and the dynamic bound: the Mosaic kernel's tests compiled, the index-sharing
    # test alone (its reason), both kernels at decode (32K, 128K) and prefill shapes, with fp8 keys and the bound
    run 150 gpu_tests_mgpu2.txt python3 -m pytest -v --tb=short -p no:cacheprovider -x \
      tests/test_user_path_kernels.py::test_index_sharing_runs_through_the_kernel_with_xlas_tokens \
      tests/test_index_scores_mgpu.py
    run 150 index_scores_mgpu2.md python3 -m benchmarks.dsa_parts --capacity 32768 131072 --batch 1 8 64 --tokens 4 \
      --parts scores --iters 10
    run 120 prefill_parts_mgpu.md python3 -m benchmarks.prefill_parts --capacity 33280 --chunk 2048 --position 16384 \
      --block-tokens 4 --topk "radix (library)"
    ;;
  mla)  # the Mosaic GPU kernels' GPU tests (no -x: every verdict), then the sparse-MLA kernels timed
    run 200 gpu_tests_mla.txt python3 -m pytest -v --tb=short -p no:cacheprovider tests/test_sparse_mla_mgpu.py \
      tests/test_index_scores_mgpu.py tests/test_user_path_kernels.py
    run 200 sparse_mla_4k.md python3 -m benchmarks.sparse_mla --batch 1 8 64 --tokens 1 4 --capacity 4096 --iters 10 \
      --fp8
    run 60 sparse_mla_32k.md python3 -m benchmarks.sparse_mla --batch 64 --tokens 4 --capacity 32768 --iters 10
    run 60 index_scores_128k.md python3 -m benchmarks.dsa_parts --capacity 131072 --batch 1 64 --tokens 4 \
      --parts scores --iters 10
    ;;
  mla2)  # after the jax 0.11.2 fix: the Mosaic sparse-MLA kernel's GPU tests, then its speed beside Triton and XLA
    run 170 gpu_tests_mla2.txt python3 -m pytest -v --tb=short -p no:cacheprovider tests/test_sparse_mla_mgpu.py \
      -k "on_the_gpu or formula or fp8_cache or models or lowered_step or split or 16_bit"
    run 200 sparse_mla_mla2.md python3 -m benchmarks.sparse_mla --batch 1 64 --tokens 1 4 --capacity 4096 --iters 10 \
      --fp8
    ;;
  mla3)  # after the staging padding went (14:00: misaligned address on the GPU): tests, then speed
    run 100 gpu_tests_mla3.txt python3 -m pytest -v --tb=short -p no:cacheprovider -x tests/test_sparse_mla_mgpu.py \
      -k "on_the_gpu or (formula and bfloat16-2-1-64-512) or fp8_cache"
    run 170 sparse_mla_mla3.md python3 -m benchmarks.sparse_mla --batch 64 1 --tokens 4 1 --capacity 4096 --iters 10 \
      --fp8
    ;;
  mla4)  # (not run yet) every Mosaic sparse-MLA GPU test, then both kernels and the contiguous re-layout timed
    run 240 gpu_tests_mla4.txt python3 -m pytest -v --tb=short -p no:cacheprovider tests/test_sparse_mla_mgpu.py \
      tests/test_user_path_kernels.py
    run 240 sparse_mla_mla4.md python3 -m benchmarks.sparse_mla --batch 64 8 1 --tokens 4 1 --capacity 4096 \
      --iters 10 --fp8
    ;;
  e2e5)  # (superseded by v256 and small) the user's path with the Mosaic index scores under auto; B = 256 × 32K verification
    run 300 e2e_mgpu.md python3 -m benchmarks.e2e --prompt 32768 8192 --batch 1 --profile --iters 5 \
      --out "$OUT/e2e_mgpu.json"
    run 250 verify_32k_b256.md python3 -m benchmarks.verify_forward --layers 4 -k 3 --forms absorbed --batch 256 \
      --capacity 32768 --profile --iters 5
    ;;
  fp8mg)  # the Mosaic GPU FP8 grouped matmul: its tests compiled, then timed beside the Triton kernel; the two
          # Mosaic sparse-MLA failures of mla4 (80 heads, 128 entries a step) and the index-sharing test, each with
          # its reason (mla4's call ended inside the index-sharing test: --timeout prints where it waits)
    run 90 gpu_tests_fp8mg.txt python3 -m pytest -v --tb=short -p no:cacheprovider \
      tests/test_fp8_grouped_matmul_mgpu.py
    run 300 fp8_mgpu.md python3 -m benchmarks.fp8_mgpu --assignments 8 64 512 2048 --rows 1 8 64 --iters 20
    run 60 gpu_tests_mla_80.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_sparse_mla_mgpu.py \
      -k "formula_and_xla and bfloat16-1-2-80"
    run 90 gpu_tests_share.txt python3 -m pytest -q --tb=short -p no:cacheprovider --timeout 80 \
      tests/test_user_path_kernels.py -k index_sharing
    ;;
  fp8mg2)  # after the 8-row-aligned tiles (fp8mg: rows past an 8-row boundary wrong when a group started off one)
    run 80 gpu_tests_fp8mg2.txt python3 -m pytest -q --tb=short -p no:cacheprovider \
      tests/test_fp8_grouped_matmul_mgpu.py
    run 200 fp8_mgpu2.md python3 -m benchmarks.fp8_mgpu --assignments 8 64 2048 --rows 1 64 --iters 20
    ;;
  fp8mg3)  # (not run yet) the Mosaic FP8 kernel's untimed variants (shared output staging, two subtiles a block)
    run 80 gpu_tests_fp8mg3.txt python3 -m pytest -q --tb=short -p no:cacheprovider \
      tests/test_fp8_grouped_matmul_mgpu.py
    run 300 fp8_mgpu3.md python3 -m benchmarks.fp8_mgpu --assignments 8 64 512 2048 --rows 1 8 64 --iters 20
    ;;
  small)  # (not run yet) the Triton sparse-MLA kernel at B = 1 after MAX_SPLITS 16 (mla6: 16 splits 1.3-1.9x 8),
          # its GPU tests, both kernels at B = 8 and 1, and the user's path at B = 1 (32K, 8K prompts) under auto
    run 150 gpu_tests_small.txt python3 -m pytest -q --tb=short -p no:cacheprovider \
      tests/test_sparse_mla_mgpu.py -k "gpu or lowered_step or resolution"
    # B = 8 and 1: whether the Mosaic kernel (more splits, the contiguous re-layout) can take the calls below 64
    # queries too, so that the Triton kernel can go (issue 28)
    run 150 sparse_mla_small.md python3 -m benchmarks.sparse_mla --batch 8 1 --tokens 4 1 --capacity 4096 --iters 10
    ;;
  impls)  # (2026-12-04) the user's path at B = 1 and 8 (4K prompts) with each sparse-MLA kernel forced: whether the
          # Mosaic kernel can take the calls below 64 queries (small: noisy, Triton faster only at B = 1, T = 1), so
          # that the Triton one can go (issue 28); then the draft step at B = 64, 4K vs 128K caches (issue 28: <= 1.10x)
    echo "stage $1: it forced --sparse-attention-impl pallas_gpu, the Triton kernel removed on 2026-12-04; see benchmarks/README.md" >&2
    exit 2
    for impl in pallas_gpu mosaic_gpu; do
      run 200 "e2e_small_$impl.md" python3 -m benchmarks.e2e --prompt 4096 --batch 1 8 --iters 5 \
        --cli=--sparse-attention-impl "--cli=$impl"
    done
    run 160 draft_128k.md python3 -m benchmarks.mtp_step --preset deepseek_v32 --batch 64 --capacity 4096 131072 \
      --iters 10
    ;;
  notriton)  # (2026-12-04) after the Triton sparse-MLA kernel went (auto: Mosaic at every query count on Hopper): the
             # GPU tests of the paths that changed, compiled; the draft step at B = 1 and 8 (it ran Triton there)
    run 200 gpu_tests_notriton.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_sparse_mla_mgpu.py \
      tests/test_user_path_kernels.py tests/test_auto_gpu_paths.py tests/test_fp8_mla_cache.py -k "not tpu"
    run 200 draft_small_b.md python3 -m benchmarks.mtp_step --preset deepseek_v32 --batch 1 8 --capacity 4096 131072 \
      --iters 20
    ;;
  dbuf)  # (2026-12-04 12:26) the double-buffered Mosaic sparse MLA (Config.double_buffered: two buffer sets, 32 entries a
         # step): its compiled tests, then timed beside the single-buffered default at B = 64 / 8 / 1 (issue 28: the
         # default is 0.38 of its floor at B = 64, T = 4)
    run 150 gpu_tests_dbuf.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_sparse_mla_mgpu.py \
      -k "double or v32_widths_on_the_gpu"
    run 300 sparse_mla_dbuf.md python3 -m benchmarks.sparse_mla --batch 64 8 1 --tokens 4 1 --capacity 4096 --iters 10 \
      --fp8
    ;;
  gemms)  # (2026-12-04 12:35) the verification forward's dense GEMMs: XLA's Triton GEMM fusions (q_b_proj 81 µs a call at
          # B = 64, ~240 TFLOP/s; W_UV's product 93 µs for 4.3 GFLOP) against cuBLAS, B = 64 and 256 at 4K, per part
    for flags in "" "--xla_gpu_enable_triton_gemm=false"; do
      XLA_FLAGS="$flags" run 250 "verify_gemms${flags:+_cublas}.md" python3 -m benchmarks.verify_forward --layers 4 -k 3 \
        --forms absorbed --batch 64 256 --capacity 4096 --all-experts-touched --profile --iters 5
    done
    ;;
  e2eb1)  # the user's path at B = 1 (32K, 8K prompts) under auto (split from small: one call held both poorly)
    run 300 e2e_b1.md python3 -m benchmarks.e2e --prompt 32768 8192 --batch 1 --iters 5 --out "$OUT/e2e_b1.json"
    ;;
  fp8e2e)  # (2026-12-04 12:47: B = 64 did not finish in 280 s a run; a 32K prompt did not on 12-03) FP8 weights on the
           # user's path after the prefill rule (a chunk's dense FP8 linears on XLA's GEMM, the bytes layout bounded):
           # `fp8e2e` under auto; `fp8e2e IMPL` with --fp8-matmul-impl IMPL (mosaic_gpu; triton until 2026-12-05)
    impl="${2:-auto}"
    flags=(); [ "$impl" != auto ] && flags=(--cli=--fp8-matmul-impl "--cli=$impl")
    run 280 "e2e_fp8_${impl}_b64.md" python3 -m benchmarks.e2e --weights fp8 --prompt 1024 --batch 64 --iters 5 \
      "${flags[@]}"
    run 280 "e2e_fp8_${impl}_32k.md" python3 -m benchmarks.e2e --weights fp8 --prompt 32768 --batch 1 --iters 5 \
      "${flags[@]}"
    ;;
  mla5)  # (not run yet) Config.whole_rows / issue_warps: compiled tests, then timed (bf16 and fp8 caches); first
         # whether jax_triton runs on the image (carry .whl-probe: jax_triton 0.3.1 takes triton >= 3.6, 0.4.1 >= 3.7)
    for v in 0.3.1 0.4.1; do
      python3 -m pip install -q --no-index --no-deps --target "/tmp/jt$v" .whl-probe/jax_triton-$v-*.whl \
        && PYTHONPATH="/tmp/jt$v:${PYTHONPATH:-}" run 60 "jax_triton_$v.txt" python3 tools/jax_triton_probe.py
    done
    run 120 gpu_tests_mla5.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_sparse_mla_mgpu.py \
      -k "variants or v32_widths_on_the_gpu"
    run 300 sparse_mla_mla5.md python3 -m benchmarks.sparse_mla --batch 64 8 1 --tokens 4 1 --capacity 4096 \
      --iters 10 --fp8
    ;;
  mla6)  # (not run yet) the new Mosaic defaults and auto rule on the verification forward (issue 27's misses)
    run 100 gpu_tests_mla6.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_sparse_mla_mgpu.py \
      tests/test_fp8_mla_cache.py -k "v32_widths_on_the_gpu or models_attention or gpu"
    run 80 sparse_mla_mla6.md python3 -m benchmarks.sparse_mla --batch 1 --tokens 4 1 --capacity 4096 --iters 10 --fp8
    run 170 verify_4k_mla6.md python3 -m benchmarks.verify_forward --layers 4 -k 3 --forms absorbed --batch 64 256 \
      --capacity 4096 --profile --iters 5
    run 190 verify_32k_b256.md python3 -m benchmarks.verify_forward --layers 4 -k 3 --forms absorbed --batch 256 \
      --capacity 32768 --profile --iters 5
    ;;
  v256)  # (22:10) the bf16 experts at verification's 1,024 tokens (tokamax block_m 128 swept), then B = 256 ×
         # 32K with JAX's pool at 95 % of the device (its default 75 % is 104 GiB: a 4-layer target's 68 GiB of
         # weights and 44 GiB of caches do not fit it) and the floor assuming all experts (mla6: the routing count
         # ran out of memory)
    run 150 experts_verify.md python3 -m benchmarks.moe_experts --batch 256 1024 --impls tokamax_gpu --sweep \
      --iters 10
    run 220 verify_32k_b256.md env XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python3 -m benchmarks.verify_forward \
      --layers 4 -k 3 --forms absorbed --batch 256 --capacity 32768 --all-experts-touched --profile --iters 5
    ;;
  caches)  # vLLM's V3.2 storage on the user's path (fp8 MLA cache, double-buffered in the Mosaic kernel since
          # 2026-12-04, and fp8 indexer keys) beside bf16 caches, one call: a 32K prompt at B = 1
    run 270 e2e_fp8_caches.md python3 -m benchmarks.e2e --prompt 32768 --batch 1 --iters 5 \
      --cli=--kv-cache-dtype --cli=fp8 --cli=--index-cache-dtype --cli=fp8
    run 270 e2e_bf16_caches.md python3 -m benchmarks.e2e --prompt 32768 --batch 1 --iters 5
    ;;
  profile)  # (not run yet) where the sparse MLA's step goes: its GPU tests with the profiler and ids_before_dots, then
            # Mosaic GPU's on-device profile of its phases (bf16 two sets, one set, fp8, ids before the dots) at
            # B = 64, T = 4. The profiler writes its trace through a host callback, which needs the CPU platform.
    export JAX_PLATFORMS=cuda,cpu
    run 150 gpu_tests_profile.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_sparse_mla_profile.py \
      tests/test_sparse_mla_mgpu.py -k "profiled or shared_memory_holds or v32_widths_on_the_gpu"
    for flags in "" "--one-set" "--fp8" "--ids-before-dots"; do
      run 90 "profile${flags//-/_}.md" python3 -m benchmarks.sparse_mla_profile --batch 64 --tokens 4 $flags
    done
    ;;
  ids)  # (not run yet) the kernel's rows at B = 64 and 8, ids_before_dots timed beside auto (bf16 and fp8 caches)
    run 560 sparse_mla_ids.md python3 -m benchmarks.sparse_mla --batch 64 8 --tokens 4 1 --capacity 4096 --iters 10 --fp8
    ;;
  ablate)  # where the sparse MLA's step goes: the kernel timed with phases removed, bf16 and fp8 caches; then the
           # model path's GPU tests under auto (two buffer sets from two queries)
    run 100 gpu_tests_ablate.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_sparse_mla_ablate.py
    run 200 ablate_bf16.md python3 -m benchmarks.sparse_mla_ablate --batch 64 --tokens 4
    run 200 ablate_fp8.md python3 -m benchmarks.sparse_mla_ablate --batch 64 --tokens 4 --fp8
    run 200 gpu_tests_model_path.txt python3 -m pytest -q --tb=short -p no:cacheprovider \
      tests/test_user_path_kernels.py tests/test_ran_kernels.py tests/test_sparse_mla_mgpu.py -k "gpu or lowered_step or \
      resolution or index_sharing or user_path or impls"
    ;;
  verify64x3)  # the verification forward at B = 64 (4K) three times, for a median and its spread; the ablation's GPU
               # test (its traced-body comparison)
    run 60 gpu_tests_ablate2.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_sparse_mla_ablate.py
    for i in 1 2 3; do
      run 115 "verify_b64_run$i.md" python3 -m benchmarks.verify_forward --layers 4 -k 3 --forms absorbed --batch 64 \
        --capacity 4096 --iters 5
    done
    ;;
  vrelay)  # (18:10 2026-12-04) Config.values_relayout (its flag removed 2026-12-05): its compiled tests, then timed
           # beside auto at B = 64 and 8 (bf16 and fp8 caches; the fp8 kernel's gather chain is where it should gain),
           # then the ablation of the default
    run 100 gpu_tests_vrelay.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_sparse_mla_ablate.py \
      tests/test_sparse_mla_mgpu.py -k "v32_widths_on_the_gpu or rows_run"
    run 480 sparse_mla_vrelay.md python3 -m benchmarks.sparse_mla --batch 64 8 --tokens 4 1 --capacity 4096 --iters 10 \
      --fp8
    ;;
  vrelay2)  # (never run: vrelay found Config.values_relayout no faster) the ablation of that form; the form and
            # sparse_mla_ablate's --values-relayout were removed on 2026-12-05
    echo "stage $1: removed with Config.values_relayout (2026-12-05); see RESULTS.md" >&2
    exit 2
    ;;
  splits)  # (2026-12-04 evening) the sparse MLA's splits swept around config_for's (vrelay: half of auto's was faster
           # at every shape with more than one), fp8 rows with ids_before_dots too; then MLA's projections laid out
           # ahead vs the model's per-call slices (mla_projections)
    run 420 sparse_mla_splits.md python3 -m benchmarks.sparse_mla_splits --batch 64 8 1 --tokens 4 1 --iters 20
    run 120 mla_projections.md python3 -m benchmarks.mla_projections --tokens 256 1024
    ;;
  splits2)  # after the one-wave split rule: the sparse MLA's compiled tests at V3.2 widths, then the index scores'
            # splits swept at 128K (its config_for also asks for two CTAs a core)
    run 120 gpu_tests_splits.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_sparse_mla_mgpu.py \
      tests/test_sweep_benchmarks.py -k "v32_widths_on_the_gpu or rows_run or splits or forms_agree"
    run 240 index_scores_splits.md python3 -m benchmarks.index_scores_splits --capacity 131072 --batch 64 8 1 \
      --tokens 4 1 --iters 20
    ;;
  splits3)  # the user's path after the split rules: e2e at B = 1 and 8 (4K prompts), the verification forward at
            # B = 64 (median of 3 from one compile), the model path's GPU tests under auto
    run 200 e2e_small.md python3 -m benchmarks.e2e --prompt 4096 --batch 1 8 --iters 5
    run 150 verify_b64.md python3 -m benchmarks.verify_forward --layers 4 -k 3 --forms absorbed --batch 64 \
      --capacity 4096 --iters 5 --repeats 3
    run 170 gpu_tests_path.txt python3 -m pytest -v --tb=short -p no:cacheprovider tests/test_auto_gpu_paths.py \
      tests/test_user_path_kernels.py tests/test_ran_kernels.py -k "gpu or lowered_step or resolution or user_path"
    ;;
  fp8q)  # (not run yet) the index scores with float8 q beside float8 keys (a float8 × float8 wgmma, the fp8 index
         # cache's path since 2026-12-04 21:50): timed beside bf16 keys and widened fp8 keys at T = 4 with the FLOPs
         # floor; the kernel's compiled tests; then the user path's GPU tests (path4's, for keys_in_registers too)
    run 110 index_scores_fp8q.md python3 -m benchmarks.index_scores_splits --capacity 131072 32768 --batch 64 8 \
      --tokens 4 --no-sweep --iters 10
    run 100 gpu_tests_fp8q.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_index_scores_mgpu.py \
      tests/test_auto_gpu_paths.py -k "float8_queries or lowered_step or refuses or float8_dot"
    run 170 gpu_tests_path.txt python3 -m pytest -v --tb=short -p no:cacheprovider tests/test_auto_gpu_paths.py \
      tests/test_user_path_kernels.py tests/test_ran_kernels.py -k "gpu or lowered_step or resolution or user_path"
    ;;
  fp8q2)  # (2026-12-05) after fp8q (8 float8-q tests failed, their output cut by the bound): those tests with the
          # float8 wgmma's tolerance and FLOAT8_SCORES_DOT on; the three key forms at T = 1; then fp8round's profile
    run 120 gpu_tests_fp8q2.txt python3 -m pytest -q --tb=line -p no:cacheprovider tests/test_index_scores_mgpu.py \
      -k "float8_queries or float8_scores_dot"
    run 100 index_scores_fp8q_t1.md python3 -m benchmarks.index_scores_splits --capacity 131072 32768 --batch 64 8 1 \
      --tokens 1 --no-sweep --iters 10
    run 280 step_profile_fp8.md python3 -m benchmarks.step_profile --batch 64 --weights fp8 bf16 --capacity 1283
    ;;
  dense)  # (09:12 2026-12-05, an H100; built 2026-12-05) MLA's dense absorbed attention (V3 models; V3.2 under index_topk positions) in bf16 split
          # form against the fp32 HIGHEST form it replaced (the FP8 step profile's 2 × ~290 µs a layer at B = 64 over a
          # 1K prompt's 1,283 slots), then speculative == plain on a dense V3 model in bf16 on the GPU
    run 80 dense_attention.md python3 -m benchmarks.dense_attention --batch 64 --tokens 1 4 --capacity 1283 --iters 10
    run 90 gpu_tests_dense.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_speculative.py \
      -k "past_index_topk and (v3-bfloat16-4 or v3-bfloat16-1 or v3-bfloat16-3)"
    # the FP8 round at B = 64 over a 1K prompt (0.58 of its floor on 2026-12-04 21:34, with the fp32 dense dots)
    run 300 e2e_fp8_b64_dense.md python3 -m benchmarks.e2e --weights fp8 --prompt 1024 --batch 64 --iters 5
    ;;
  shortreq)  # (09:32 2026-12-05, an H100) a V3.2 request under index_topk slots attended by the sparse-MLA kernel over every visible slot
             # (mla.attends_every_slot_by_kernel) instead of XLA's dense form (dense: 0.10 / 0.08 of its floor at B = 64,
             # T = 1 / 4, 1,283 slots, an H100): the three forms timed, the path's GPU tests, the FP8 round at B = 64 × 1K
    run 90 dense_attention_kernel.md python3 -m benchmarks.dense_attention --batch 64 8 --tokens 1 4 --capacity 1283 \
      --iters 10
    run 100 gpu_tests_shortreq.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_user_path_kernels.py \
      -k "short_request or within_index_topk or odd_prompt or reused_selection"
    run 300 e2e_fp8_b64_short.md python3 -m benchmarks.e2e --weights fp8 --prompt 1024 --batch 64 --iters 5
    ;;
  shortbf16)  # (its first command ran bare at 17:46 2026-12-07 on an H100: B = 64 out of memory in the naive prefill; see shortfix) the user's path with bf16 weights at 1K prompts (B = 64, 8) since a cache within index_topk is
              # attended by the sparse kernel from 8 queries a call (shortreq timed FP8 weights only)
    run 300 e2e_short_bf16.md python3 -m benchmarks.e2e --prompt 1024 --batch 64 8 --iters 5
    # sampled at DeepSeek's suggested settings: the round with top-p's sort of the vocabulary, beside greedy's above
    run 200 e2e_short_sampled.md python3 -m benchmarks.e2e --prompt 1024 --batch 64 --iters 5 \
      --cli=--temperature --cli=0.6 --cli=--top-p --cli=0.95
    ;;
  tokens2)  # (not run yet) the dense form against the kernel at 1–32 queries (auto's EVERY_SLOT_KERNEL_MIN_QUERIES = 8,
            # untimed below 8), then tokens' GPU tests bounded to fit the session's last device minutes
    run 45 dense_attention_small.md python3 -m benchmarks.dense_attention --batch 1 8 --tokens 1 4 --capacity 1283 \
      --iters 10
    run 200 gpu_tests_tokens.txt python3 -m pytest -q -rfE --tb=line -p no:cacheprovider tests/test_speculative.py \
      tests/test_auto_gpu_paths.py tests/test_index_share.py
    run 90 gpu_tests_tokens2.txt python3 -m pytest -q -rfE --tb=line -p no:cacheprovider tests/test_sparse_mla_mgpu.py \
      tests/test_user_path_kernels.py tests/test_fp8_weights.py -k "tokens or index_sharing or speculative or short_request"
    ;;
  fp8nk)  # (13:01 2026-12-05, an H100: its 10 tests passed; the [E, N, K] form no faster than the [E, K, N] one,
         # removed; the auto tests ran out of time) the FP8 grouped matmul over codes stored [E, N, K]
    echo "fp8nk: the [E, N, K] kernel was removed after this stage's run (benchmarks/RESULTS.md)"
    ;;
  notritonfp8)  # (15:17 2026-12-05, an H100: 36 passed, 9 skipped) after the Pallas Triton FP8 kernel's removal: the FP8 paths' GPU tests through the
                # Mosaic kernel, the kernel's own compiled tests
    run 190 gpu_tests_fp8.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider \
      tests/test_fp8_grouped_matmul_mgpu.py tests/test_fp8_weights.py \
      -k "kernel or refuses or grouped or speculative_and_plain or prefill_chunks"
    # the dense 64-row default (two subtiles, shared output staging) timed at last, with the experts' 8 and 64
    run 150 fp8_mgpu_default.md python3 -m benchmarks.fp8_mgpu --assignments 8 64 --rows 1 64 --iters 20
    ;;
  compact)  # (15:24 2026-12-05, an H100: B = 64's e2e row cut by the bound) the FP8 kernel's grid over min(A, E) group slots (2026-12-05) timed beside the grid over
            # all experts (8 assignments: 248 of 256 experts' CTAs empty), then the user's FP8 path at B = 1 and 64
            # under auto (1K prompts: the first timing of it since the Triton kernel went)
    run 240 fp8_mgpu_compact.md python3 -m benchmarks.fp8_mgpu --assignments 8 64 512 --rows 1 64 --iters 20
    run 330 e2e_fp8_compact.md python3 -m benchmarks.e2e --weights fp8 --prompt 1024 --batch 1 64 --iters 5
    ;;
  router)  # (15:44 2026-12-05, an H100; its bit-mask form by hand 15:46) the router's logits: one fp32 dot (CUDA cores) against three bf16 dots over the weight's
           # exact split, T = 1 to 4,096 (moe.ROUTER_SPLIT_MIN_TOKENS is set from it)
    run 150 router.md python3 -m benchmarks.router --tokens 1 8 16 32 64 128 256 1024 4096
    ;;
  apart|apart2|apart3|apart4|apart5)  # (2026-12-05 18:17–19:00, an H100) Config.values_warpgroups=2, a fourth
    # warpgroup for P · V: refused by ptxas until each values half ran as two m64n128 wgmmas (apart5: compiled, its 12
    # tests passed, no faster), then removed with its tests and `benchmarks.sparse_mla --candidates`; what each stage
    # found is in RESULTS.md's 2026-12-05 18:17–19:03 section and h200_runs/apart*_*/
    echo "stage $1: removed with Config.values_warpgroups (2026-12-05); see RESULTS.md" >&2
    exit 2
    ;;
  tokens4)  # (not run yet) what tokens3 (15:35 2026-12-05, an H100: 31 passed, 9 skipped, none failed) did not reach:
            # test_speculative's past-index_topk cases from GLM-5 bf16 k = 3 on, and its last five tests
    run 420 gpu_tests_spec2.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider tests/test_speculative.py \
      -k "(past_index_topk and not glm5) or glm5-bfloat16-3 or glm5-bfloat16-4 or decide or stop"
    ;;
  tokens5)  # (11:03 2026-12-06, an H100: 2 passed, 3 skipped, none failed) the kernels' token tests tokens3 did not reach (its 200 s went to the index-sharing test),
            # each test bounded so that one slow compile names itself and the rest still run
    run 540 gpu_tests_tokens3.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 240 \
      tests/test_user_path_kernels.py tests/test_fp8_weights.py -k "tokens or index_sharing or speculative"
    ;;
  tokens3)  # (15:35 2026-12-05, an H100: both commands reached their bounds, none failed; the rest: tokens4, tokens5) test_speculative's GPU cases (its tp > 1 cases skip on one GPU since 2026-12-05: at 12:26
            # three of them failed in make_mesh), then the kernels' token tests
    run 330 gpu_tests_spec.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider tests/test_speculative.py
    run 200 gpu_tests_tokens2.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider tests/test_sparse_mla_mgpu.py \
      tests/test_user_path_kernels.py tests/test_fp8_weights.py -k "tokens or index_sharing or speculative"
    ;;
  tokens)  # (12:26 2026-12-05, an H200: both runs ran out of time; 3 tp > 1 cases failed on one GPU, since skipped) the GPU's token tests after the random init's embedding went from normal(1) to
          # normal(0.02) (the layers now decide random models' tokens; before, no token test could see them): every GPU
          # speculative == plain case, the kernels against XLA by tokens (their prompts' greedy margin checked first)
    run 300 gpu_tests_tokens.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_speculative.py \
      tests/test_auto_gpu_paths.py tests/test_index_share.py
    run 240 gpu_tests_tokens2.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_sparse_mla_mgpu.py \
      tests/test_user_path_kernels.py tests/test_fp8_weights.py -k "tokens or index_sharing or speculative"
    ;;
  fp8round)  # (not run yet) where the FP8 round at B = 64 goes (0.58 of its floor at 21:34, bf16's 1.04): the draft
             # step's kernels per model part with FP8 and bf16 weights at B = 64 (a 1K prompt's capacity)
    run 300 step_profile_fp8.md python3 -m benchmarks.step_profile --batch 64 --weights fp8 bf16 --capacity 1283
    ;;
  path4)  # the user's path after keys_in_registers became the default for bf16 keys (2026-12-04 21:30) and
          # overlap_queries (18:56): the model path's GPU tests under auto first (splits3's ran out at 13 of 18), then e2e
    run 230 gpu_tests_path.txt python3 -m pytest -v --tb=short -p no:cacheprovider tests/test_auto_gpu_paths.py \
      tests/test_user_path_kernels.py tests/test_ran_kernels.py -k "gpu or lowered_step or resolution or user_path"
    run 175 e2e_small.md python3 -m benchmarks.e2e --prompt 4096 --batch 8 1 --iters 5
    ;;
  overlap)  # (18:56 2026-12-04) Config.overlap_queries of the index scores (query n + 1's dot during query n's epilogue): its compiled
            # tests, then timed beside auto at T = 4 (verification), 128K and 32K
    run 90 gpu_tests_overlap.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_index_scores_mgpu.py \
      -k "True and (equals or float8)"
    run 120 index_scores_overlap.md python3 -m benchmarks.index_scores_splits --capacity 131072 32768 --batch 64 8 \
      --tokens 4 --no-sweep --iters 20
    ;;
  kregs)  # (21:20 2026-12-04) the index scores' Config.keys_in_registers (a step's keys read once into wgmma's register
          # operand for the block's queries): its compiled tests (never run: the interpreter has no register-operand
          # wgmma), then timed beside auto at T = 4, 128K and 32K; if faster, it becomes the default
    run 120 gpu_tests_kregs.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_index_scores_mgpu.py \
      -k "registers or equals or float8"
    run 150 index_scores_kregs.md python3 -m benchmarks.index_scores_splits --capacity 131072 32768 --batch 64 8 \
      --tokens 4 --no-sweep --keys-in-registers --iters 20
    ;;
  handoff)  # (21:20 2026-12-04: the ping-pong and qk rows ran, pv refused two swizzles on 0.11.2) what one hand-off
            # between warpgroups and one wgmma of the sparse MLA's step cost alone (benchmarks.mgpu_handoff): whether
            # its ~0.8 µs a step is hand-offs or the products' latency; the products at the kernel's 64 B swizzle
    run 90 handoff.md python3 -m benchmarks.mgpu_handoff --reps 2000 --entries 32 48 64 --forms qk pv --swizzle 32 64 128
    ;;
  topk4)  # (07:58 2026-12-06, an H100: faster at each; auto widened) the k-th key kernel where auto does not take it yet: a 32K prompt's prefill chunks (2,048 and
          # 4,096 queries, XLA's top-k 73 ms of the 32K prefill's 0.52 s on 2026-12-03) and 64 / 128 queries a call
    run 250 topk_prefill.md python3 -m benchmarks.prefill_parts --capacity 33280 --chunk 2048 4096 --position 16384 \
      --topk "radix (library)" "k-th key: Mosaic GPU kernel" --trace
    run 200 topk_queries.md python3 -m benchmarks.dsa_parts --capacity 4608 32768 --batch 16 32 --tokens 4 \
      --parts top-k --topk-forms library-kernel
    ;;
  topk6)  # (08:31 2026-12-06, an H100: cut by the budget, none failed) after auto took the k-th key kernel from 64 queries a call up (prefill chunks included): its
          # GPU tests, then the user path's token tests under auto (a prompt's prefill now runs the kernel)
    run 150 gpu_tests_topk.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider tests/test_topk_mgpu.py
    run 170 gpu_tests_auto.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider tests/test_auto_gpu_paths.py \
      tests/test_user_path_kernels.py -k "tokens or speculative"
    ;;
  onescan)  # (08:24 2026-12-06, an H100: the packed scan slower at 2,048 queries and 32K; reverted with its benchmark
            # forms) the compaction packed into one scan beside the two scans, then the verification forward at 32K
    echo "stage $1: the packed one-scan compaction was reverted on 2026-12-06 (slower); see RESULTS.md" >&2
    exit 2
    ;;
  wgroups)  # (10:59 2026-12-06, an H100: the split rows wrong compiled, no faster; removed, exits 2 since) the k-th
            # key kernel with a row over 2 and 4 warpgroups and with its tie cutoff: compiled tests, timed B = 1, 8, 64
    echo "stage $1: the row split over warpgroups was removed on 2026-12-06 (wrong keys compiled); see RESULTS.md" >&2
    exit 2
    ;;
  topkforms)  # (14:09 2026-12-06, an H100: packed sums 1.36x at 256 queries; the table lost to the SASS dump on
              # stdout (MOSAIC_GPU_DUMP_TO did not take), re-run bare at 14:16) the k-th key kernel's pass forms
    echo "stage $1: its forms (1-bit digits; packed sums as a flag) were settled on 2026-12-06; run topkforms2" >&2
    exit 2
    ;;
  topkforms2)  # (14:27 2026-12-06, an H100: the forms timed; 14 of 41 tests passed before the device budget ran out)
               # after packed sums became the default and the chunk stopped having to divide the row: the forms
               # timed in one run at the CLI's shapes, then the kernel's compiled tests (33,280 slots among them)
    # (since 15:30: four forms at five shapes, packed_lazy among them; the compiled tests are stage topktests)
    run 520 topk_forms2.md python3 -m benchmarks.topk_forms --iters 50
    ;;
  fitcheck)  # (not run yet) what 2026-12-06's evening changed on the load path, on a GPU: the weights-fit check
             # against a real allocator (the full V3.2 config on one GPU refused from its config alone), the FP8
             # split-block refusals, and convert's copy decoding the source's tokens (~2 min)
    run 200 gpu_tests_fitcheck.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 150 \
      tests/test_weights_fit.py tests/test_convert.py tests/test_fp8_weights.py -k "fit or convert or copy or refuse"
    ;;
  topktests)  # (not run yet) the top-k kernel's compiled tests after packed sums, the last-chunk step, packed_lazy
              # and the sign-bit case (topkforms2 ran 14 of them before the budget ran out on 2026-12-06)
    run 520 gpu_tests_topk3.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 100 \
      tests/test_topk_mgpu.py -k "not lowered_step and not lowered_for"
    ;;
  capacities)  # (15:20 2026-12-07, an H100: cut by its bound in the 32,768 rows; RESULTS) the index scores and the top-k at the CLI's real capacities beside the round ones the
               # benchmarks used (4,352 / 33,024 slots: 4K / 32K prompts at --max-new-tokens 32, the CLI's default):
               # the index scores' splits must divide S / 128, so 4,352 (34 steps) gives B = 1 two CTAs of 17 steps
               # where 4,096 gave eight of 4 (docs/mosaic_gpu_notes.md, "The kernels at the CLI's capacities")
    run 420 dsa_capacities.md python3 -m benchmarks.dsa_parts --capacity 4096 4352 32768 33024 --batch 1 8 64 \
      --tokens 1 4 --parts scores top-k --topk-forms library-kernel --iters 20
    ;;
  uneven)  # (its sweep ran bare at 15:27 2026-12-07 on an H100, B = 1 and 8: now auto; its compiled tests in autochk at 17:35) the index scores' uneven splits (built 2026-12-06 on a CPU; `auto` still takes divisors
           # only): their compiled tests, then swept beside the divisors at the CLI's capacities for 4K and 32K
           # prompts; if faster at B = 1 and 8, config_for may take them (waves × blocks a CTA)
    run 200 gpu_tests_uneven.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 100 \
      tests/test_index_scores_mgpu.py -k "640 or uneven or positions_bound"
    run 330 index_scores_uneven.md python3 -m benchmarks.index_scores_splits --capacity 4352 33024 --batch 1 8 64 \
      --tokens 4 1 --uneven --iters 20
    ;;
  audit)  # (13:54 2026-12-06, an H100: 29 passed) GPU-only tests strengthened on 2026-12-06 without a GPU: tokamax's experts against
          # ragged_dot with loud experts (hidden states and drafts), the FP8 kernel's and fp8 cache's token tests with
          # their margins checked (these ran on the CPU's interpreter), compiled
    # then the rest of the auto paths' and the user path's token tests under the top-k's tie cutoff (the default
    # since 2026-12-06 11:22, not yet run there compiled)
    run 240 gpu_tests_audit.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 200 \
      tests/test_experts_gpu.py tests/test_auto_gpu_paths.py -k "ragged_dot or fp8_kernel_gives or fp8_key_cache"
    run 280 gpu_tests_tiecut_tokens.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 200 \
      tests/test_user_path_kernels.py tests/test_auto_gpu_paths.py -k "not (ragged_dot or fp8_kernel_gives or fp8_key_cache)"
    ;;
  tiecut3)  # after tiecut2 (11:15 2026-12-06, an H100: the tie cutoff faster at 64, 256 and 2,048 queries; its compiled
            # tests passed): the model's top-k through it by default, its model-level GPU tests
    run 240 gpu_tests_topk_model2.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 150 \
      tests/test_topk_mgpu.py -k "model or speculative or selection_by"
    ;;
  tiecut2)  # after tiecut (11:07 2026-12-06, an H100: the tie cutoff 2,191 µs at a 2,048-query chunk against the kernel's
            # 2,574 and XLA's 2,747; 75 against 66 µs at 256 queries over 4,608 slots, one run): its compiled tests (the
            # search's −inf shortcut), its rows at 64 and 256 queries again, and at a prompt's first chunk (every row
            # sees fewer slots than k)
    run 150 gpu_tests_tiecut.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 120 \
      tests/test_topk_mgpu.py -k "tie_cutoff or v32"
    run 200 topk_tiecut_decode.md python3 -m benchmarks.dsa_parts --capacity 4608 32768 --batch 16 64 --tokens 4 \
      --parts top-k --topk-forms library-kernel --iters 50
    run 120 topk_tiecut_first_chunk.md python3 -m benchmarks.prefill_parts --capacity 33280 --chunk 2048 \
      --position 0 --topk "radix (library)" "k-th key: Mosaic GPU kernel" "k-th key and tie cutoff: Mosaic GPU kernel" \
      --trace
    ;;
  tiecut)  # after wgroups (10:59 2026-12-06, an H100: the 2- and 4-warpgroup forms wrong on the GPU, removed; the tie
           # cutoff right): the tie cutoff's form at a 32K prompt's 2,048-query prefill chunk beside the kernel and XLA's
           # radix select, then the top-k kernel's model-level GPU tests (speculative == plain, lax.top_k's slots)
    run 200 topk_tiecut_prefill.md python3 -m benchmarks.prefill_parts --capacity 33280 --chunk 2048 \
      --position 16384 --topk "radix (library)" "k-th key: Mosaic GPU kernel" \
      "k-th key and tie cutoff: Mosaic GPU kernel" --trace
    run 330 gpu_tests_topk_model.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 200 \
      tests/test_topk_mgpu.py -k "model or speculative or cutoff_equals"
    ;;
  wgroups2)  # (never run; superseded by tiecut) the warpgroup forms at a 32K prompt's prefill chunk
    echo "stage $1: the row split over warpgroups was removed on 2026-12-06; tiecut ran the tie cutoff's rows" >&2
    exit 2
    ;;
  topk5)  # (not run yet) the user's path at a 32K prompt, B = 1, with the top-k auto (XLA in the prefill chunks) and
          # with the kernel forced (its prefill chunks and its round)
    run 270 e2e_32k_topk.md python3 -m benchmarks.e2e --prompt 32768 --batch 1 --iters 5 --out "$OUT/e2e_32k.json"
    run 270 e2e_32k_topk_kernel.md python3 -m benchmarks.e2e --prompt 32768 --batch 1 --iters 5 \
      --cli=--topk-impl --cli=mosaic_gpu --out "$OUT/e2e_32k_kernel.json"
    ;;
  topk3)  # (06:16 2026-12-06, an H100: cut at B = 16 and in the tests) after topk2 (the verification forward
          # 1.0-1.1 % faster with the kernel at B = 64; its chunk
          # rows cut by a chunk that did not divide 4,608): the kernel beside the library by queries a call, for auto's
          # rule; then its compiled V3.2-shape tests
    run 170 topk_queries.md python3 -m benchmarks.dsa_parts --capacity 4608 32768 --batch 1 8 16 64 --tokens 4 \
      --parts top-k --topk-forms library-kernel
    run 170 gpu_tests_topk.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider tests/test_topk_mgpu.py \
      -k "gpu or model or speculative"
    ;;
  topk2)  # (06:07 2026-12-06, an H100: the forward 1.0-1.1 % faster with it; one test fault) after topk1 (22
          # compiled tests passed; the kernel 113 µs of 328 at B = 64 × 32K, one warpgroup a
          # row): wider loop steps (chunk 4,096) compiled and timed; the verification forward at 4K and 32K, B = 64,
          # with XLA's top-k and with the kernel
    run 150 gpu_tests_topk.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider tests/test_topk_mgpu.py -k gpu
    run 110 topk_kernel.md python3 -m benchmarks.dsa_parts --capacity 4608 32768 --batch 1 64 --tokens 4 --parts top-k
    layers=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | awk '{print ($1 > 120000) ? 4 : 3}')
    run 150 verify_4k_topk.md python3 -m benchmarks.verify_forward --layers "$layers" -k 3 --forms absorbed \
      --batch 64 --capacity 4096 --topk-impls xla mosaic_gpu --iters 5
    run 140 verify_32k_topk.md python3 -m benchmarks.verify_forward --layers "$layers" -k 3 --forms absorbed \
      --batch 64 --capacity 32768 --topk-impls xla mosaic_gpu --iters 5 --all-experts-touched
    ;;
  topk1)  # (05:59 2026-12-06, an H100: 22 passed; 275 vs 328 µs at B = 64 × 32K) the top-k's k-th key on Mosaic
          # GPU (kernels/topk_mgpu.py): its tests compiled, its rows beside
          # XLA's forms (B = 1, 64 at T = 4; 4.5K and 32K slots), then the verification forward at 32K, B = 64, with
          # XLA's top-k and with the kernel (each row's kernels per part)
    run 150 gpu_tests_topk.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider tests/test_topk_mgpu.py
    run 150 topk_kernel.md python3 -m benchmarks.dsa_parts --capacity 4608 32768 --batch 1 64 --tokens 4 --parts top-k
    layers=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | awk '{print ($1 > 120000) ? 4 : 3}')
    run 270 verify_32k_topk.md python3 -m benchmarks.verify_forward --layers "$layers" -k 3 --forms absorbed \
      --batch 64 --capacity 32768 --topk-impls xla mosaic_gpu --profile --iters 5
    ;;
  v32topk)  # (05:49 2026-12-06, an H100) topk's rows, then verify32k's (4 layers, B = 64 and 256 on an H200; 3 layers, B = 64 on an
            # H100): what the top-k forms cost at verification's 256 queries, then the forward at 32K since 2026-12-03
    run 170 topk_verify.md python3 -m benchmarks.dsa_parts --capacity 4608 32768 --batch 64 --tokens 4 --parts top-k
    verify_32k 330
    ;;
  topk)  # (run as v32topk, 05:49 2026-12-06) the top-k forms at verification's 256 queries (B = 64, T = 4) over a 4K and a 32K cache: the
         # library's radix select against lax.top_k (at 33K and 256 queries 381 against 701 µs; 4K not timed) and the
         # histogram passes (indexer.kth_key_histograms: 2 passes of 16 bits or 4 of 8, a scatter-add each)
    run 200 topk_verify.md python3 -m benchmarks.dsa_parts --capacity 4608 32768 --batch 64 --tokens 4 --parts top-k
    ;;
  fp8gpu)  # (21:28 2026-12-04: 37 passed, 3 tp > 1 cases failed on one GPU, since skipped) the FP8 paths' GPU tests: the prefill rule and the bounded "bytes" layout ran none on
            # 2026-12-04 (take it before fp8e2e, which fills its own call)
    run 300 gpu_tests_fp8.txt python3 -m pytest -q --tb=short -p no:cacheprovider tests/test_fp8_weights.py \
      tests/test_auto_gpu_paths.py -k "fp8 or dense or layout or prefill"
    ;;
  heads)  # (22:38 2026-12-05, an H100: heads-major no faster, 20.46 against 20.42 ms at B = 64; its fp8 compiled case
          # failed; removed with its tests and flags the same evening) the sparse-MLA kernel's q~ / output as [N, B, T, C]
    echo "stage $1: the heads-major form was removed on 2026-12-05 (no faster); see RESULTS.md" >&2
    exit 2
    ;;
  xover|xover2|xover3|crossover)  # (2026-12-06 00:25–04:41, an H100) FlashMLA's crossover (Config.crossover: a
    # query's two head blocks as a 2-CTA cluster, each gathering half of a step's rows into both CTAs' operands).
    # xover: the probe hung and the async_store_smem kernel crashed on jax 0.11.2; xover3 ran xover2 (the plain-store
    # exchanges, the kernel timed, its compiled tests, the verification forward with it forced): correct, 1.19-1.20x
    # slower, no faster forward; crossover never ran. Then removed with tools/crossover_probe.py,
    # tools/crossover_variants.py, their tests and sparse_mla_splits --crossover; the form is at 03b5fef. What each
    # stage found is in RESULTS.md's 2026-12-06 sections and h200_runs/xover*_*/
    echo "stage $1: the crossover was removed on 2026-12-06 (1.19-1.20x slower; last at 03b5fef); see RESULTS.md" >&2
    exit 2
    ;;
  gemms2)  # (22:43 2026-12-05, an H100: no kernel path built) whether a Mosaic GPU matmul streams V3.2's dense weights faster than XLA's GEMM at
           # verification's rows (q_b_proj: 80 µs on XLA's Triton fusion, 44 on cuBLAS, ~24 roofline at 256 rows)
    run 320 dense_gemms_256.md python3 -m benchmarks.dense_gemms --rows 256 --iters 20
    run 240 dense_gemms_64_1024.md python3 -m benchmarks.dense_gemms --rows 64 1024 --iters 20 \
      --only q_b_proj o_proj "dense MLP" head
    ;;
  e2eidx)  # (17:37 2026-12-07, an H100: the round equal, 7.18 against 7.20 ms at B = 1; auto kept) the user's path at B = 1 over 4K prompts under auto (the index-scores kernel), then with
           # --index-scores-impl xla: `capacities` (2026-12-07 15:20) put XLA's scores dot 10-40 µs a call ahead of the
           # kernel at B = 1 over 4K caches; whether a 2-layer round shows it, and B = 8 beside it
    run 250 e2e_idx_auto.md python3 -m benchmarks.e2e --prompt 4096 --batch 1 8 --iters 5 --out "$OUT/e2e_idx_auto.json"
    run 250 e2e_idx_xla.md python3 -m benchmarks.e2e --prompt 4096 --batch 1 8 --iters 5 \
      --cli=--index-scores-impl --cli=xla --out "$OUT/e2e_idx_xla.json"
    ;;
  padsel)  # (15:15 2026-12-07, an H100: padded_entries 3.1-8.5x faster at B = 1 and 8; the index-sharing test cut by the bound) the model pads a selection that does not come in whole
           # splits (index_share's 2,050 entries at k = 3; a short request's every visible slot) to
           # sparse_mla_mgpu.padded_entries' width, which buys splits where the CTAs do not fill a wave, instead of
           # to whole steps (33 steps of 64 at B = 1: one split, 2 CTAs): both widths timed, then the compiled tests
    run 200 sparse_mla_padding.md python3 -m benchmarks.sparse_mla_padding --iters 20
    run 200 gpu_tests_padsel.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 100 \
      tests/test_sparse_mla_mgpu.py tests/test_user_path_kernels.py -k "not tpu and (padded or index_sharing or equals)"
    ;;
  autochk)  # (17:35 2026-12-07, an H100: 28 passed; the index-sharing test passed) the compiled tests of what auto took on 2026-12-07 from an H100 sweep: the index
            # scores' uneven splits (`uneven`'s tests) and the padded selection's index-sharing model test alone
            # (~200 s to compile; `padsel`'s bound cut it)
    run 200 gpu_tests_uneven.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 100 \
      tests/test_index_scores_mgpu.py -k "640 or uneven or positions_bound"
    run 330 gpu_tests_index_sharing.txt python3 -m pytest -v -rfE --tb=short -p no:cacheprovider --timeout 320 \
      tests/test_user_path_kernels.py -k index_sharing
    ;;
  idxauto)  # (17:28 2026-12-07, an H100; RESULTS) where the index scores' `auto` should leave the kernel for the model's XLA path:
            # `capacities` (15:20, an H100) put XLA's bf16 dot 10-40 µs ahead at B = 1 over 4K caches; auto beside
            # XLA at the CLI's capacities for 2K-32K prompts (+ 32 new + k, rounded to 256), B = 1-16, T = 1 and 4
    run 560 index_scores_auto.md python3 -m benchmarks.index_scores_splits --capacity 2304 4352 8448 16640 33024 \
      --batch 1 2 4 8 16 --tokens 1 4 --no-sweep --beside-xla --forms bf16 "fp8 q" --iters 20
    ;;
  shortfix)  # (2026-12-07 evening) shortbf16 (17:46, an H100) ran out of memory at B = 64 over 1K prompts in the naive
             # prefill's expansion of the cache (5.0 GiB a layer, uncounted); since then prefill.dense_cache_plan
             # counts it and takes the absorbed form (the sparse-MLA kernel over every visible slot) there
    run 300 e2e_short_fix.md python3 -m benchmarks.e2e --prompt 1024 --batch 64 8 --iters 5
    # the GPU tests of the changed paths: the prefill's plan and forms, and the sampling filters' radix search
    run 250 gpu_tests_shortfix.txt python3 -m pytest -q -rfE --tb=short -p no:cacheprovider \
      tests/test_user_path_kernels.py tests/test_prefill.py tests/test_sampling.py
    ;;
  flashprobe)  # (not run yet) the naive prefill past 2,048 slots in blocks (jax_mtp.mla_blocked, 2026-12-07 night:
               # a V3 model's 32K prompt in chunks of 2,048 where the whole form's N × S fp32 scores a query left 128,
               # each expanding the whole cache) beside the whole form, the expansion in the call; then whether
               # tokamax's attention takes MLA's naive prefill (192-wide q·k, 128-wide v, a position mask) and how
               # fast; then a V3.2 short request's cache at B = 64 (whole only: within 2,048 slots)
    run 330 naive_prefill_attention.md python3 -m benchmarks.naive_prefill_attention --batch 1 --chunk 128 2048 \
      --capacity 32768 --iters 10
    run 200 naive_prefill_attention_short.md python3 -m benchmarks.naive_prefill_attention --batch 64 --chunk 64 512 \
      --capacity 1280 --iters 10
    ;;
  sampling)  # (not run yet) what a round's acceptance costs at V3.2-Exp's generation_config (temperature 0.6, top-p 0.95:
             # decode's default with a real checkpoint), whose top-p sorts the vocabulary at every verified position,
             # beside greedy's; then the user's path sampled so (B = 64 over 1K prompts) beside shortfix's greedy row
    run 150 sampling_filters.md python3 -m benchmarks.sampling_filters --batch 1 8 64 256
    run 250 e2e_short_sampled.md python3 -m benchmarks.e2e --prompt 1024 --batch 64 --iters 5 \
      --cli=--temperature --cli=0.6 --cli=--top-p --cli=0.95
    ;;
  direct)  # (not run yet) the sparse MLA's direct gather (Config.direct_gather, 2026-12-07 night: cp.async by the gather
          # warpgroup's threads straight into two 64-entry swizzled operand sets, no staging, no re-layout): where its
          # rows land (compiled only), the kernel's compiled tests, then timed beside auto (two staged sets of 32)
    run 170 gpu_tests_direct.txt python3 -m pytest -v --tb=short -p no:cacheprovider \
      tests/test_sparse_mla_mgpu_gather.py tests/test_sparse_mla_mgpu.py -k "direct or on_the_gpu"
    run 200 sparse_mla_direct.md python3 -m benchmarks.sparse_mla --batch 64 8 --tokens 4 --capacity 4096 --iters 10
    ;;
  direct2)  # (not run yet) direct cut to ~4 minutes of device time: where the copies land, the direct form's compiled
           # tests, then it and auto timed at B = 64, T = 4
    run 110 gpu_tests_direct.txt python3 -m pytest -v --tb=short -p no:cacheprovider \
      tests/test_sparse_mla_mgpu_gather.py tests/test_sparse_mla_mgpu.py -k "direct"
    run 90 sparse_mla_direct.md python3 -m benchmarks.sparse_mla --batch 64 --tokens 4 --capacity 4096 --iters 10 \
      --first
    ;;
  *) echo "unknown stage $1"; exit 2 ;;
esac
