"""Layer 3: reports (HTML, Markdown, figures, exports) rendered from run folders alone, no torch."""
