"""The API's routes, one module per resource; each builds an ``APIRouter`` from the small ``ApiContext``."""
