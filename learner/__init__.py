"""The Train Engine: CISPO on windowed-FIFO batches from the pool, FSDP2, checkpoints, weight streaming."""
