"""Model in, pictures out: DOT/SVG, HTML tables, the stepper, plots. Views never read torch's graph."""
