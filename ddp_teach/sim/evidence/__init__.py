"""The simulator's evidence, kept as data: published measurements of real
GPUs in TOML files (`manifest.toml` says what each field means and lists
the sources), read by `loader` only when asked. Nothing here is imported by
`import ddp_teach`: the model must not depend on what it is checked
against (Phantora keeps its measured timings the same way, as data files
with a manifest)."""
