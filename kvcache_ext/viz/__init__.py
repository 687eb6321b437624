"""Layer 7, pictures of plans: the data model of a plan's pages and address walks (model.py), as
text (text.py), as a picture of boxes (picture.py), the packed slab of cache groups (slab.py),
and the HTML page, SVG and PNG drawn from them (page.py)."""
