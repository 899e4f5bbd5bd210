"""Names the dispatcher writes onto objects: API group, labels, finalizer. Pure."""

GROUP = "workload.codeflare.dev"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "AppWrapper"
PLURAL = "appwrappers"

# Every wrapped object, and every pod template inside it, carries these labels, so the
# dispatcher finds its pods (of any kind, a RayCluster's included) and can adopt or
# collect its objects after a restart.
LABEL_NAME = f"{GROUP}/appwrapper"
LABEL_NAMESPACE = f"{GROUP}/appwrapper-namespace"
LABEL_UID = f"{GROUP}/appwrapper-uid"

FINALIZER = f"{GROUP}/finalizer"
ANNOTATION_ITEM = f"{GROUP}/item-index"
