"""Small corpora in the layouts of the field's natural benchmarks, generated here (this
project ships them, and tests build their own): FEMNIST's Hugging Face Parquet layout
(`femnist.py`), Shakespeare's (`shakespeare.py`) and LEAF's JSON files (`leaf_json.py`).
They stand in for the real data where it cannot be downloaded; docs/natural-data.md says
what they hold and how to get the real sets."""
