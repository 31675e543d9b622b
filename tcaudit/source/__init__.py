"""Discovery and parsing: which files to scan, and each file read and parsed once."""
