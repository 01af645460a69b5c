"""Rendering: the report's charts (``charts``) and HTML pieces (``html``), the report pipeline
(``report``: papermill + nbconvert), the explorer page (``explorer``, a Jinja2 template plus a JS
file in ``templates/``) and what the CLI prints (``terminal``)."""
