//! KV capacity from GPU memory.
