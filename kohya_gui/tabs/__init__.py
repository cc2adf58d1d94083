"""One module per tab; the mode tabs share ``mode_tab.build_mode_tab``."""
