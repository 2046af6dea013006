"""binder"""
