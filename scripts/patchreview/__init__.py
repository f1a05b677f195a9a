"""The reviewer's tools: each patch, the net diff, ours beside upstream's fix (text, HTML)."""
