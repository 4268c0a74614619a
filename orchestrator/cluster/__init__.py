"""Several machines, one fabric."""
