"""The record and the dataset: its one declaration, the store, sweep metadata."""
