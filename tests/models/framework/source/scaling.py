def scale(value, factor):
    return value * factor
