"""The HTTP API (``/api/v1``) and the web console, over the same admin operations as the CLI.

``app.create_app`` builds the ASGI application around one ``AdminClient`` (one ZooKeeper session per
server: servers are stateless, run as many as you like); ``auth`` resolves and checks the admin token;
``errors`` maps the admin library's errors onto HTTP statuses; ``static/`` is the console (plain HTML,
CSS and JavaScript: no build step). ``zkctl api run`` serves it with uvicorn.
"""
