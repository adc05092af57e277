"""The core layer: sessions over the native engine, traces, model facts, drafters and errors."""
