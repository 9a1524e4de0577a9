"""/explain: which parts of a text drove an embedding, a similarity or a score (occlusion)."""
