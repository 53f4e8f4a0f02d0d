"""``isinstance`` against several classes with one read of the object's ``__class__``.

``isinstance(obj, (A, B, C))`` that finds ``obj`` of none of them reads ``obj.__class__`` once per
class (an object may name another class there). An object whose class defines ``__getattribute__``
in Python (transformers' configs, read at every ``config.x`` the traced program makes) runs that
code at each read: about 2 us each, hundreds per compile in the observer."""


def instance_of(obj, classes: tuple) -> bool:
    """``isinstance(obj, classes)`` for plain classes (their metaclass keeps ``type``'s instance
    and subclass checks), reading ``obj.__class__`` at most once. (Where that read raises other
    than AttributeError for an object of a later class, this answers True where isinstance raises.)"""
    t = type(obj)
    if issubclass(t, classes):
        return True
    try:
        named = obj.__class__
    except AttributeError:
        return False
    return named is not t and issubclass(type(named), type) and issubclass(named, classes)
