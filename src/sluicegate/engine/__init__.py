"""Inference engines behind one small protocol (`engine.protocol`)."""
