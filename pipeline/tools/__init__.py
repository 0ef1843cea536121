"""Programs around the pipeline: benchmark, stress test, GPU check, synthetic models, the
llama.cpp builder."""
