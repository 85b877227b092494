"""The translation server behind `python -m seq2seq.serve`: a JSON API (app), requests from
concurrent clients decoded together (batching), what a request may hold (schema), and the page
at / that shows attention (static/)."""
