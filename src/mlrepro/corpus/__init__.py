"""Pretraining corpora: sharded download → zstd extraction → concatenation → Megatron .bin/.idx → blend.

One module per job: `shards` (the shard list, its RANK/WORLD_SIZE split, the download),
`extract` (zstandard), `concat`, `tokenizer` and `preprocess` (jsonl → indexed dataset,
byte-identical to Megatron-LM's tools/preprocess_data.py), `indexed` (the .bin/.idx format,
writer and reader), `blend` (the data_prefix list), `stages` (what each Snakemake rule of
workflow/rules/corpus.smk calls) and `minicorpus` (a corpus and tokenizer made here, for
tests and benchmarks).
"""
